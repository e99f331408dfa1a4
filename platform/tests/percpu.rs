//! `smp::PerCpu` on the host, where the running CPU is always the bootstrap one (index 0):
//! each CPU's value made on first use and kept, and a nested borrow of the same value refused
//! instead of handing out a second `&mut`.

use bareverbs_platform::smp::{PerCpu, cpu_id, cpus};

static COUNTER: PerCpu<u64> = PerCpu::new(|| 40);

#[test]
fn a_value_is_made_once_and_kept_per_cpu() {
    assert_eq!(cpu_id(), 0);
    assert_eq!(cpus(), 1);
    let v: PerCpu<Vec<u32>> = PerCpu::new(Vec::new);
    assert_eq!(v.with(|x| x.len()), Some(0));
    v.with(|x| x.push(7)).unwrap();
    v.with(|x| x.push(8)).unwrap();
    assert_eq!(v.with(|x| x.clone()), Some(vec![7, 8]));
    assert_eq!(
        COUNTER.with(|c| {
            *c += 2;
            *c
        }),
        Some(42)
    );
}

#[test]
fn a_nested_borrow_of_the_same_value_is_refused() {
    let v: PerCpu<u32> = PerCpu::new(|| 1);
    let inner = v.with(|outer| {
        *outer += 1;
        v.with(|x| *x += 100)
    });
    assert_eq!(inner, Some(None));
    assert_eq!(v.with(|x| *x), Some(2), "the nested call changed nothing");
    // Another value may be borrowed inside.
    let w: PerCpu<u32> = PerCpu::new(|| 5);
    assert_eq!(v.with(|_| w.with(|y| *y)), Some(Some(5)));
}

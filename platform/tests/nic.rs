//! The command line's choice of NIC family (`bvnic=`).

use bareverbs_platform::nic::Family;

#[test]
fn bvnic_names_a_family_or_is_refused() {
    assert_eq!(Family::from_cmdline("bvroce=10.0.0.2/24"), Ok(None));
    assert_eq!(Family::from_cmdline(""), Ok(None));
    for f in Family::ALL {
        let line = format!("bvroce=10.0.0.2/24 bvnic={} bvroce.peer=10.0.0.1", f.name());
        assert_eq!(Family::from_cmdline(&line), Ok(Some(f)));
    }
    assert_eq!(Family::from_cmdline("bvnic=e1000"), Err("e1000"));
    assert_eq!(Family::from_cmdline("bvnic="), Err(""));
    // The first `bvnic=` word decides.
    assert_eq!(
        Family::from_cmdline("bvnic=igb bvnic=virtio"),
        Ok(Some(Family::Igb))
    );
}

#[test]
fn families_are_looked_for_igb_first_then_e1000e_then_virtio() {
    assert_eq!(Family::ALL, [Family::Igb, Family::E1000e, Family::Virtio]);
    assert_eq!(Family::from_name("virtio-net"), None);
}

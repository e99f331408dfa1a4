//! The fuzzer's own observations: the project's frames of a backtrace, the logger that counts
//! the driver's leak warnings, and the panic hook that keeps the last panic for the report.

use super::*;

/// The frames of a backtrace that are this project's code (needs line tables), as
/// "function at file:line" lines.
pub(crate) fn own_frames() -> Vec<String> {
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let lines: Vec<&str> = bt.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let l = l.trim();
        if l.starts_with("at ")
            && (l.contains("/src/") || l.contains("/tests/"))
            && !l.contains("/rustc/")
            && !l.contains("/.cargo/")
        {
            let f = lines[i.saturating_sub(1)].trim();
            let f = f.split_once(": ").map_or(f, |(_, f)| f);
            if f != "own_frames" && f != "panic_hook" {
                out.push(format!("{f} {l}"));
            }
        }
    }
    out
}

/// Counts the driver's warnings: it logs one each time it keeps memory on purpose.
pub(crate) struct Logger;

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }

    fn log(&self, r: &log::Record<'_>) {
        if r.level() <= log::Level::Warn && r.target().starts_with("bareverbs") {
            WARNINGS.with(|w| w.set(w.get() + 1));
        }
    }

    fn flush(&self) {}
}

pub(crate) static LOGGER: Logger = Logger;

pub(crate) fn panic_hook(info: &panic::PanicHookInfo<'_>) {
    let msg = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic)".into());
    let mut at = info
        .location()
        .map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
    let traced = BACKTRACE.with(Cell::get);
    let frames = if traced || at.contains("/rustc/") {
        own_frames()
    } else {
        Vec::new()
    };
    if at.contains("/rustc/") {
        // A panic inside core (an overflow in a method): name the project's caller.
        if let Some(f) = frames.iter().find(|f| !f.contains("tests/fuzz.rs")) {
            let site = f.rsplit("at ./").next().unwrap_or(f);
            at = format!("{} in core", site.rsplit_once(':').map_or(site, |(a, _)| a));
        }
    }
    let mut text = format!("{msg} (at {at})");
    if traced {
        text.push_str("\n    backtrace (this project's frames):");
        for f in &frames {
            text.push_str("\n      ");
            text.push_str(f);
        }
    }
    PANIC.with(|p| {
        let mut p = p.borrow_mut();
        if p.is_some() {
            // A panic while unwinding from another: the process aborts next. Say which seed.
            let seed = SEED.with(Cell::get);
            eprintln!(
                "fuzz: seed {seed}: panic while panicking ({text}; first: {}): aborting; \
                 replay with tests/fuzz.sh 1 {seed}",
                p.as_deref().unwrap_or("")
            );
        } else {
            *p = Some(text);
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Objects with stable addresses: queue pairs keep pointers to their PD, CQs and SRQ (the
// provider contract) and borrow them, so those are boxed and handed out as references whose
// lifetime this file vouches for with a count of users.

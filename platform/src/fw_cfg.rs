//! QEMU's firmware configuration device (fw_cfg): a named file that the host hands the kernel
//! with `-fw_cfg name=opt/…,file=PATH`, read through the device's two I/O ports. The labs pass
//! what does not fit on the PVH command line this way (`docs/testing.md`: QEMU's PVH option
//! ROM copies the command line into a 4,096-byte buffer, and passes no `-initrd` module).
//!
//! The device is the host's, and the host is not trusted: the directory's count and every
//! file's size are bounded before they size a loop or a read, a name must end within its 56
//! bytes, a file longer than the caller's buffer is refused, and text must be UTF-8. What is
//! wrong comes back as an [`FwCfgError`]. Nothing is indexed by a value the device wrote.
//!
//! The parsing is over a [`Ports`] implementation, so that the host tests play a device that
//! lies; [`IoPorts`] is the real one (x86 ports `0x510`, selector, and `0x511`, data).

use core::fmt;

/// The signature item's key: reads `QEMU` when the device is there.
const SIGNATURE: u16 = 0x0000;
/// The file directory's key: a big-endian count, then 64-byte entries.
const FILE_DIR: u16 = 0x0019;
/// Bytes of a directory entry: size (be32), select (be16), reserved (be16), name (56 bytes).
const ENTRY: usize = 64;
/// Bytes of a directory entry's name, its NUL included.
pub const NAME_MAX: usize = 56;
/// Directory entries looked at most (QEMU's machines have a few dozen file slots).
pub const MAX_FILES: u32 = 1024;

/// The device's two registers.
pub trait Ports {
    /// Selects the item `key`; the next reads start at its first byte.
    fn select(&mut self, key: u16);
    /// The selected item's next byte (past its end the device reads 0).
    fn read(&mut self) -> u8;
}

/// The fw_cfg device at x86 I/O ports `0x510` (16-bit selector) and `0x511` (data).
pub struct IoPorts(());

impl IoPorts {
    /// The device's ports.
    ///
    /// # Safety
    ///
    /// The caller is the only user of ports `0x510`–`0x511` while the value lives (nothing
    /// else selects an item between its reads).
    pub unsafe fn new() -> IoPorts {
        IoPorts(())
    }
}

impl Ports for IoPorts {
    fn select(&mut self, key: u16) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the fw_cfg selector register; a write selects an item and changes nothing
        // else (sole user: `new`'s contract).
        unsafe {
            x86_64::instructions::port::Port::<u16>::new(0x510).write(key)
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = key;
    }

    fn read(&mut self) -> u8 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the fw_cfg data register; a read returns the selected item's next byte and
        // moves its offset, nothing else (sole user: `new`'s contract).
        unsafe {
            x86_64::instructions::port::Port::<u8>::new(0x511).read()
        }
        #[cfg(not(target_arch = "x86_64"))]
        0
    }
}

/// What is wrong with a file the device was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FwCfgError {
    /// The signature item does not read `QEMU`: no fw_cfg device.
    NoDevice,
    /// The name asked for is empty or has no room for its NUL in a directory entry.
    BadName,
    /// The directory names no such file (among its first [`MAX_FILES`] entries).
    NotFound,
    /// The directory claims more entries than [`MAX_FILES`] and the file is not among the
    /// first ones.
    Directory {
        /// The count the directory claims.
        count: u32,
    },
    /// The file is larger than the buffer it is read into.
    TooLarge {
        /// The size the directory claims.
        size: u32,
        /// Bytes the buffer holds.
        max: usize,
    },
    /// The file is not UTF-8 text.
    NotUtf8 {
        /// The offset of the first byte that is not.
        at: usize,
    },
}

impl fmt::Display for FwCfgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDevice => write!(f, "no fw_cfg device (its signature is not QEMU)"),
            Self::BadName => write!(f, "a fw_cfg file name is 1 to {} bytes", NAME_MAX - 1),
            Self::NotFound => write!(f, "no such fw_cfg file"),
            Self::Directory { count } => write!(
                f,
                "the fw_cfg directory claims {count} files (at most {MAX_FILES} are read) and \
                 the file is not among those read"
            ),
            Self::TooLarge { size, max } => {
                write!(f, "the fw_cfg file has {size} bytes, more than {max}")
            }
            Self::NotUtf8 { at } => write!(f, "the fw_cfg file is not UTF-8 (byte {at})"),
        }
    }
}

/// Where file `name` is: its item's key and its size.
pub fn find(ports: &mut impl Ports, name: &str) -> Result<(u16, u32), FwCfgError> {
    let want = name.as_bytes();
    if want.is_empty() || want.len() >= NAME_MAX {
        return Err(FwCfgError::BadName);
    }
    ports.select(SIGNATURE);
    let mut sig = [0u8; 4];
    sig.iter_mut().for_each(|b| *b = ports.read());
    if &sig != b"QEMU" {
        return Err(FwCfgError::NoDevice);
    }
    ports.select(FILE_DIR);
    let mut word = [0u8; 4];
    word.iter_mut().for_each(|b| *b = ports.read());
    let count = u32::from_be_bytes(word);
    for _ in 0..count.min(MAX_FILES) {
        let mut e = [0u8; ENTRY];
        e.iter_mut().for_each(|b| *b = ports.read());
        let size = u32::from_be_bytes([e[0], e[1], e[2], e[3]]);
        let key = u16::from_be_bytes([e[4], e[5]]);
        let stored = &e[8..];
        // A name must end (NUL) within its field; one that does not matches nothing.
        let Some(len) = stored.iter().position(|&b| b == 0) else {
            continue;
        };
        if &stored[..len] == want {
            return Ok((key, size));
        }
    }
    if count > MAX_FILES {
        Err(FwCfgError::Directory { count })
    } else {
        Err(FwCfgError::NotFound)
    }
}

/// File `name`'s bytes, read into `buf` (a file larger than `buf` is refused).
pub fn read_file<'b>(
    ports: &mut impl Ports,
    name: &str,
    buf: &'b mut [u8],
) -> Result<&'b [u8], FwCfgError> {
    let (key, size) = find(ports, name)?;
    let max = buf.len();
    let Some(out) = usize::try_from(size).ok().and_then(|n| buf.get_mut(..n)) else {
        return Err(FwCfgError::TooLarge { size, max });
    };
    ports.select(key);
    out.iter_mut().for_each(|b| *b = ports.read());
    Ok(out)
}

/// File `name` as text, read into `buf`: UTF-8, without the whitespace at either end.
pub fn read_text<'b>(
    ports: &mut impl Ports,
    name: &str,
    buf: &'b mut [u8],
) -> Result<&'b str, FwCfgError> {
    let bytes = read_file(ports, name, buf)?;
    match core::str::from_utf8(bytes) {
        Ok(t) => Ok(t.trim_ascii()),
        Err(e) => Err(FwCfgError::NotUtf8 {
            at: e.valid_up_to(),
        }),
    }
}

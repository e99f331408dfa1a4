//! What the appliance serves, read from the kernel command line.
//!
//! The grammar is in `docs/appliance.md` ("Configuration"). In short, the words are read left
//! to right; a `bvnvmf.subsys=` word opens a subsystem, and the `bvnvmf.ns=` and
//! `bvnvmf.allow=` words after it belong to it:
//!
//! ```text
//! bvnvmf=10.0.0.2/24 bvnvmf.port=4420
//! bvnvmf.subsys=nqn.2026-11.io.example:fast bvnvmf.ns=ram:64M bvnvmf.ns=blk:0
//! bvnvmf.allow=nqn.2014-08.org.nvmexpress:uuid:0f1e2d3c-0000-0000-0000-000000000001
//! bvnvmf.subsys=nqn.2026-11.io.example:scratch bvnvmf.ns=ram:16M
//! bvnvmf.subsys=nqn.2026-11.io.example:ssd bvnvmf.ns=nvme:1 bvnvmf.ns=nvme:0/2
//! ```
//!
//! Without a `bvnvmf.subsys=` word the appliance serves its two built-in subsystems (a RAM
//! namespace of `bvnvmf.mib=` MiB, and the first virtio-blk disk when the machine has one),
//! both behind `bvnvmf.allow=`'s list, as it always has.
//!
//! The whole command line is checked against the machine ([`Machine`]) before anything is
//! served: the first word that is wrong is refused with a [`ConfigError`] naming it and what
//! is wrong with it. Words of the kernel's other parts (`console=`, `bvirq`, …) are not ours
//! and are let be; every word that starts with `bvnvmf` is ours and must be known.

use core::fmt;

use heapless::Vec;

mod multipath;
mod problem;
pub use multipath::{CNTLID_MAX, Multipath, Shared};
pub use problem::Problem;

/// Subsystems a configuration declares at most.
pub const MAX_SUBSYSTEMS: usize = 8;
/// Namespaces a subsystem has at most.
pub const MAX_NAMESPACES: usize = 8;
/// virtio-blk disks the appliance drives at most (`blk:0` to `blk:3`).
pub const MAX_DISKS: usize = 4;
/// NVMe controllers the appliance drives at most (`nvme:0/…` and `nvme:1/…`).
pub const MAX_NVME: usize = 2;
/// The highest NSID a configuration names (`nvme:C/1` to `nvme:C/64`).
pub const MAX_NSID: u32 = 64;
/// Host NQNs a subsystem lets in at most (its allow list).
pub const MAX_ALLOW: usize = 4;
/// The longest NQN (bytes): NVMe's limit, 223.
pub const MAX_NQN: usize = 223;
/// A RAM namespace's block size (bytes); its size is a multiple of it.
pub const RAM_BLOCK: u64 = 512;
/// The RAM namespace of the built-in configuration when `bvnvmf.mib=` does not size it (MiB).
pub const DEFAULT_MIB: u32 = 64;
/// The built-in configuration's RAM subsystem.
pub const NQN_RAM: &str = "nqn.2026-11.io.bareverbs:ram";
/// The built-in configuration's virtio-blk subsystem.
pub const NQN_BLK: &str = "nqn.2026-11.io.bareverbs:virtio-blk";
/// The discovery subsystem's well-known NQN: the target serves it itself, so no declared
/// subsystem may take it.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// The port when `bvnvmf.port=` does not say (NVMe over RDMA's, 4420).
pub const DEFAULT_PORT: u16 = 4420;
/// The address without `bvnvmf=`: QEMU's user network's guest address (prefix 24).
pub const DEFAULT_IP: [u8; 4] = [10, 0, 2, 15];

/// What the machine has, against which a configuration is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    /// virtio-blk disks found on the PCI bus (`blk:0` is the first).
    pub disks: usize,
    /// Bytes of memory the RAM namespaces may take together.
    pub ram_bytes: u64,
    /// The NVMe namespaces each controller serves (PCI order): bit `n` is NSID `n + 1`.
    pub nvme: [u64; MAX_NVME],
}

/// What a namespace is backed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// RAM of this many bytes (a multiple of [`RAM_BLOCK`]), gone at power-off.
    Ram {
        /// Its size in bytes.
        bytes: u64,
    },
    /// The whole virtio-blk disk of this index (PCI order, from 0).
    Blk {
        /// Which disk.
        index: usize,
    },
    /// A namespace of an NVMe controller (PCI order, from 0).
    Nvme {
        /// Which controller.
        controller: usize,
        /// The namespace's NSID on it.
        nsid: u32,
    },
}

/// One declared subsystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemConfig<'a> {
    /// Its NQN.
    pub nqn: &'a str,
    /// Its namespaces, NSID `k + 1` for `namespaces[k]`.
    pub namespaces: Vec<Medium, MAX_NAMESPACES>,
    /// The host NQNs it lets in; empty: any host.
    pub allow: Vec<&'a str, MAX_ALLOW>,
    /// Its namespaces' identities and ANA groups' states.
    pub shared: Shared,
}

/// What the appliance serves and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config<'a> {
    /// Its IPv4 address.
    pub ip: [u8; 4],
    /// The address's prefix length.
    pub prefix: u8,
    /// The rdma_cm port it listens on.
    pub port: u16,
    /// `bvnvmf.host=`: a Linux nvmet-rdma target to connect to as a host before serving.
    pub host: Option<[u8; 4]>,
    /// `bvnvmf.serve=S`: seconds to serve before stopping as on the console's `q` (none:
    /// until `q`).
    pub serve_secs: Option<u32>,
    /// The subsystems, in the order declared.
    pub subsystems: Vec<SubsystemConfig<'a>, MAX_SUBSYSTEMS>,
    /// Whether they are the built-in ones (no `bvnvmf.subsys=` word).
    pub built_in: bool,
    /// Its controller ID range, port ID and peers.
    pub multipath: Multipath,
}

/// A refused configuration: the word and what is wrong with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfigError<'a> {
    /// The word as written (empty when the built-in RAM namespace does not fit: no word asked
    /// for it).
    pub word: &'a str,
    /// What is wrong.
    pub problem: Problem,
}

impl fmt::Display for ConfigError<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.word.is_empty() {
            write!(f, "{}", self.problem)
        } else {
            write!(f, "`{}`: {}", self.word, self.problem)
        }
    }
}

/// `A.B.C.D` as bytes.
pub fn ipv4(s: &str) -> Option<[u8; 4]> {
    let mut ip = [0u8; 4];
    let mut parts = s.split('.');
    for b in &mut ip {
        let p = parts.next()?;
        // `u8::from_str` takes a leading `+`; an address does not.
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        *b = p.parse().ok()?;
    }
    parts.next().is_none().then_some(ip)
}

/// A size: decimal bytes, or with a suffix K, M or G (powers of 1024).
fn size(s: &str) -> Option<u64> {
    let (digits, unit) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// Whether `s` is an NQN we take: 1 to [`MAX_NQN`] bytes, `nqn.` first, no control characters
/// (the command line has no white space in a word).
fn nqn_ok(s: &str) -> bool {
    s.len() <= MAX_NQN && s.len() > 4 && s.starts_with("nqn.") && !s.chars().any(char::is_control)
}

/// The parser's state: the words seen so far.
struct Reader<'a> {
    machine: Machine,
    address: Option<([u8; 4], u8)>,
    port: Option<u16>,
    host: Option<[u8; 4]>,
    serve: Option<u32>,
    mib: Option<(&'a str, u32)>,
    /// `bvnvmf.allow=` before any subsystem: the built-in configuration's list.
    allow: Option<(&'a str, Vec<&'a str, MAX_ALLOW>)>,
    subsystems: Vec<SubsystemConfig<'a>, MAX_SUBSYSTEMS>,
    /// The word that opened each subsystem (for [`Problem::NoNamespace`]).
    opened_by: Vec<&'a str, MAX_SUBSYSTEMS>,
    /// The disks taken, by index (a bit each; the machine's count is bounded below).
    disks_taken: u64,
    /// The NVMe namespaces taken, per controller (bit `n`: NSID `n + 1`).
    nvme_taken: [u64; MAX_NVME],
    ram: u64,
    /// The multipath words' settings so far.
    mp: Multipath,
    cntlid_set: bool,
    port_id_set: bool,
    /// The namespaces given an ANA group (bit `subsystem × 8 + namespace`).
    groups_set: u64,
}

impl<'a> Config<'a> {
    /// Reads the appliance's words from `cmdline` and checks them against `machine`.
    ///
    /// Without `bvnvmf=` the appliance is at [`DEFAULT_IP`]/24.
    ///
    /// # Errors
    ///
    /// The first word that is unknown, malformed or contradicts an earlier one or the
    /// machine, as a [`ConfigError`].
    pub fn parse(cmdline: &'a str, machine: &Machine) -> Result<Config<'a>, ConfigError<'a>> {
        let mut r = Reader {
            machine: *machine,
            address: None,
            port: None,
            host: None,
            serve: None,
            mib: None,
            allow: None,
            subsystems: Vec::new(),
            opened_by: Vec::new(),
            disks_taken: 0,
            nvme_taken: [0; MAX_NVME],
            ram: 0,
            mp: Multipath::default(),
            cntlid_set: false,
            port_id_set: false,
            groups_set: 0,
        };
        for word in cmdline.split_ascii_whitespace() {
            if word.starts_with("bvnvmf") {
                r.word(word)
                    .map_err(|problem| ConfigError { word, problem })?;
            }
        }
        r.finish()
    }

    /// The RAM namespaces' bytes together.
    pub fn ram_bytes(&self) -> u64 {
        self.subsystems
            .iter()
            .flat_map(|s| s.namespaces.iter())
            .map(|m| match m {
                Medium::Ram { bytes } => *bytes,
                Medium::Blk { .. } | Medium::Nvme { .. } => 0,
            })
            .sum()
    }
}

fn push<T, const N: usize>(v: &mut Vec<T, N>, x: T, full: Problem) -> Result<(), Problem> {
    v.push(x).map_err(|_| full)
}

impl<'a> Reader<'a> {
    fn word(&mut self, word: &'a str) -> Result<(), Problem> {
        let (key, value) = word.split_once('=').ok_or(Problem::UnknownWord)?;
        match key {
            "bvnvmf" => {
                if self.address.is_some() {
                    return Err(Problem::Repeated);
                }
                let (ip, prefix) = value.split_once('/').unwrap_or((value, "24"));
                let ip = ipv4(ip).ok_or(Problem::BadAddress)?;
                let prefix = match prefix.parse::<u8>() {
                    Ok(p) if p <= 32 && prefix.bytes().all(|c| c.is_ascii_digit()) => p,
                    _ => return Err(Problem::BadPrefix),
                };
                self.address = Some((ip, prefix));
            }
            "bvnvmf.port" => {
                if self.port.is_some() {
                    return Err(Problem::Repeated);
                }
                match value.parse::<u16>() {
                    Ok(p) if p != 0 && value.bytes().all(|c| c.is_ascii_digit()) => {
                        self.port = Some(p)
                    }
                    _ => return Err(Problem::BadPort),
                }
            }
            "bvnvmf.host" => {
                if self.host.is_some() {
                    return Err(Problem::Repeated);
                }
                self.host = Some(ipv4(value).ok_or(Problem::BadAddress)?);
            }
            "bvnvmf.serve" => {
                if self.serve.is_some() {
                    return Err(Problem::Repeated);
                }
                match value.parse::<u32>() {
                    Ok(t) if t != 0 && value.bytes().all(|c| c.is_ascii_digit()) => {
                        self.serve = Some(t)
                    }
                    _ => return Err(Problem::BadSeconds),
                }
            }
            "bvnvmf.mib" => {
                if self.mib.is_some() {
                    return Err(Problem::Repeated);
                }
                if !self.subsystems.is_empty() {
                    return Err(Problem::MibWithSubsystems);
                }
                let room = self.machine.ram_bytes >> 20;
                match value.parse::<u32>() {
                    Ok(m)
                        if m >= 1
                            && u64::from(m) <= room
                            && value.bytes().all(|c| c.is_ascii_digit()) =>
                    {
                        self.mib = Some((value, m))
                    }
                    _ => return Err(Problem::BadMib),
                }
            }
            "bvnvmf.subsys" => {
                if self.mib.is_some() {
                    return Err(Problem::MibWithSubsystems);
                }
                if !nqn_ok(value) {
                    return Err(Problem::BadNqn);
                }
                if value == DISCOVERY_NQN {
                    return Err(Problem::DiscoveryNqn);
                }
                if self.subsystems.iter().any(|s| s.nqn == value) {
                    return Err(Problem::DuplicateNqn);
                }
                let s = SubsystemConfig {
                    nqn: value,
                    namespaces: Vec::new(),
                    allow: Vec::new(),
                    shared: Shared::default(),
                };
                push(&mut self.subsystems, s, Problem::TooManySubsystems)?;
                push(&mut self.opened_by, word, Problem::TooManySubsystems)?;
            }
            "bvnvmf.ns" => {
                let medium = self.medium(value)?;
                let s = self
                    .subsystems
                    .last_mut()
                    .ok_or(Problem::NamespaceOutsideSubsystem)?;
                push(&mut s.namespaces, medium, Problem::TooManyNamespaces)?;
                self.take(medium);
            }
            "bvnvmf.allow" => {
                let list = match self.subsystems.last_mut() {
                    Some(s) => &mut s.allow,
                    None => {
                        if self.allow.is_some() {
                            return Err(Problem::Repeated);
                        }
                        &mut self.allow.insert((word, Vec::new())).1
                    }
                };
                for nqn in value.split(',') {
                    if !nqn_ok(nqn) {
                        return Err(Problem::BadNqn);
                    }
                    if list.contains(&nqn) {
                        return Err(Problem::DuplicateHost);
                    }
                    push(list, nqn, Problem::TooManyHosts)?;
                }
            }
            _ => {
                return self
                    .multipath_word(key, value)
                    .unwrap_or(Err(Problem::UnknownWord));
            }
        }
        Ok(())
    }

    /// A namespace's medium, checked against the machine and the namespaces before it.
    fn medium(&self, value: &str) -> Result<Medium, Problem> {
        if let Some(s) = value.strip_prefix("ram:") {
            let bytes = size(s).ok_or(Problem::BadSize)?;
            if bytes == 0 || bytes % RAM_BLOCK != 0 {
                return Err(Problem::SizeNotBlocks);
            }
            let asked = self.ram.saturating_add(bytes);
            if asked > self.machine.ram_bytes {
                return Err(Problem::RamTooLarge {
                    asked,
                    room: self.machine.ram_bytes,
                });
            }
            Ok(Medium::Ram { bytes })
        } else if let Some(n) = value.strip_prefix("blk:") {
            if n.is_empty() || n.len() > 3 || !n.bytes().all(|c| c.is_ascii_digit()) {
                return Err(Problem::BadMedium);
            }
            let index: usize = n.parse().map_err(|_| Problem::BadMedium)?;
            let disks = self.machine.disks;
            if index >= disks || index >= 64 {
                return Err(Problem::NoSuchDisk { disks });
            }
            if self.disks_taken & (1 << index) != 0 {
                return Err(Problem::DiskTaken);
            }
            Ok(Medium::Blk { index })
        } else if let Some(v) = value.strip_prefix("nvme:") {
            let (c, n) = v.split_once('/').unwrap_or(("0", v));
            let number = |t: &str| {
                (!t.is_empty() && t.len() <= 10 && t.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| t.parse::<u32>().ok())
                    .flatten()
                    .ok_or(Problem::BadMedium)
            };
            let (controller, nsid) = (number(c)? as usize, number(n)?);
            let controllers = self.machine.nvme.iter().filter(|&&m| m != 0).count();
            let served = self.machine.nvme.get(controller).copied().unwrap_or(0);
            if nsid == 0 || nsid > MAX_NSID || served & (1 << (nsid - 1)) == 0 {
                return Err(Problem::NoSuchNvmeNamespace { controllers });
            }
            if self.nvme_taken[controller] & (1 << (nsid - 1)) != 0 {
                return Err(Problem::NvmeNamespaceTaken);
            }
            Ok(Medium::Nvme { controller, nsid })
        } else {
            Err(Problem::BadMedium)
        }
    }

    fn take(&mut self, medium: Medium) {
        match medium {
            Medium::Ram { bytes } => self.ram = self.ram.saturating_add(bytes),
            Medium::Blk { index } => self.disks_taken |= 1 << index,
            Medium::Nvme { controller, nsid } => {
                if let Some(t) = self.nvme_taken.get_mut(controller) {
                    *t |= 1 << (nsid - 1);
                }
            }
        }
    }

    fn finish(self) -> Result<Config<'a>, ConfigError<'a>> {
        let (ip, prefix) = self.address.unwrap_or((DEFAULT_IP, 24));
        let port = self.port.unwrap_or(DEFAULT_PORT);
        if let Some((_, word)) = self
            .subsystems
            .iter()
            .zip(self.opened_by.iter())
            .find(|(s, _)| s.namespaces.is_empty())
        {
            return Err(ConfigError {
                word,
                problem: Problem::NoNamespace,
            });
        }
        if !self.subsystems.is_empty() {
            if let Some((word, _)) = self.allow {
                return Err(ConfigError {
                    word,
                    problem: Problem::AllowOutsideSubsystem,
                });
            }
            return Ok(Config {
                ip,
                prefix,
                port,
                host: self.host,
                serve_secs: self.serve,
                subsystems: self.subsystems,
                built_in: false,
                multipath: self.mp,
            });
        }
        // The built-in configuration: a RAM subsystem and, with a disk, a virtio-blk one.
        let mib = self.mib.map_or(DEFAULT_MIB, |(_, m)| m);
        let bytes = u64::from(mib) << 20;
        if bytes > self.machine.ram_bytes {
            return Err(ConfigError {
                word: self.mib.map_or("", |(w, _)| w),
                problem: Problem::RamTooLarge {
                    asked: bytes,
                    room: self.machine.ram_bytes,
                },
            });
        }
        let allow = self.allow.map(|(_, l)| l).unwrap_or_default();
        let mut subsystems = Vec::new();
        let mut ram = Vec::new();
        let _ = ram.push(Medium::Ram { bytes });
        let _ = subsystems.push(SubsystemConfig {
            nqn: NQN_RAM,
            namespaces: ram,
            allow: allow.clone(),
            shared: Shared::default(),
        });
        let mut blk = Vec::new();
        if self.machine.disks > 0 {
            let _ = blk.push(Medium::Blk { index: 0 });
        }
        let _ = subsystems.push(SubsystemConfig {
            nqn: NQN_BLK,
            namespaces: blk,
            allow,
            shared: Shared::default(),
        });
        Ok(Config {
            ip,
            prefix,
            port,
            host: self.host,
            serve_secs: self.serve,
            subsystems,
            built_in: true,
            multipath: self.mp,
        })
    }
}

#[cfg(test)]
mod tests;

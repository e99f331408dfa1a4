//! What the appliance serves, from the kernel command line: the one place its configuration
//! is read ([`Options::parse`]). Today the subsystems are built in (a RAM disk and the first
//! virtio-blk disk, `crate::nvmf_app`); the command line gives the address, the RAM disk's
//! size, the host NQNs let in, the host mode's Linux target, and how long to serve.
//!
//! | word | meaning | default |
//! | --- | --- | --- |
//! | `bvnvmf=A.B.C.D[/N]` | the appliance's IPv4 address and prefix | [`DEFAULT_IP`]/24 |
//! | `bvnvmf.mib=M` | the RAM disk's size, 1 to [`MAX_MIB`] MiB | [`DEFAULT_MIB`] |
//! | `bvnvmf.allow=NQN[,NQN…]` | the host NQNs both subsystems let in (at most [`MAX_ALLOW`]) | any host |
//! | `bvnvmf.host=A.B.C.D` | first connect as a host to Linux's nvmet-rdma there (the lab's) | none |
//! | `bvnvmf.serve=S` | serve S seconds, then stop as on `q` | until `q` |
//!
//! A malformed word of these makes the whole line refused.

use bareverbs_platform::machine::ipv4;

/// The address the appliance takes without `bvnvmf=`: QEMU's user network's guest address.
pub const DEFAULT_IP: [u8; 4] = [10, 0, 2, 15];
/// The RAM disk's size when the command line does not say (MiB).
pub const DEFAULT_MIB: u32 = 64;
/// The largest RAM disk (MiB).
pub const MAX_MIB: u32 = 256;
/// Host NQNs `bvnvmf.allow=` takes at most.
pub const MAX_ALLOW: usize = 4;
/// The longest NQN (bytes; NVMe-oF's 223).
const MAX_NQN: usize = 223;

/// What the command line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options<'a> {
    /// This machine's IPv4 address.
    pub ip: [u8; 4],
    /// Its prefix length.
    pub prefix: u8,
    /// The RAM disk's size (MiB).
    pub mib: u32,
    /// `bvnvmf.host=`: a Linux nvmet-rdma target to connect to as a host first.
    pub host: Option<[u8; 4]>,
    /// `bvnvmf.allow=NQN[,NQN…]`: the host NQNs both subsystems let in (the first `allowed`;
    /// none: any host).
    pub allow: [&'a str; MAX_ALLOW],
    /// How many of `allow` are set.
    pub allowed: usize,
    /// `bvnvmf.serve=S`: seconds to serve before stopping (none: until `q`).
    pub serve_secs: Option<u32>,
}

impl<'a> Options<'a> {
    /// Reads `bvnvmf=A.B.C.D/N`, `bvnvmf.mib=M`, `bvnvmf.host=A.B.C.D`,
    /// `bvnvmf.allow=NQN[,NQN…]` (at most [`MAX_ALLOW`], each 1 to 223 bytes) and
    /// `bvnvmf.serve=S` from a kernel command line (other words are not the appliance's);
    /// `None` with a malformed word. Without `bvnvmf=`, at [`DEFAULT_IP`]/24.
    pub fn parse(cmdline: &'a str) -> Option<Options<'a>> {
        let mut opts = Options {
            ip: DEFAULT_IP,
            prefix: 24,
            mib: 0,
            host: None,
            allow: [""; MAX_ALLOW],
            allowed: 0,
            serve_secs: None,
        };
        let (mut mib, mut host, mut serve_secs) = (DEFAULT_MIB, None, None);
        let (mut allow, mut allowed) = ([""; MAX_ALLOW], 0);
        for w in cmdline.split_ascii_whitespace() {
            if let Some(v) = w.strip_prefix("bvnvmf=") {
                let (ip, prefix) = v.split_once('/').unwrap_or((v, "24"));
                let prefix: u8 = prefix.parse().ok().filter(|&p| p <= 32)?;
                (opts.ip, opts.prefix) = (ipv4(ip)?, prefix);
            } else if let Some(v) = w.strip_prefix("bvnvmf.mib=") {
                mib = v.parse().ok().filter(|&m| (1..=MAX_MIB).contains(&m))?;
            } else if let Some(v) = w.strip_prefix("bvnvmf.host=") {
                host = Some(ipv4(v)?);
            } else if let Some(v) = w.strip_prefix("bvnvmf.serve=") {
                serve_secs = Some(v.parse().ok()?);
            } else if let Some(v) = w.strip_prefix("bvnvmf.allow=") {
                allowed = 0;
                for nqn in v.split(',') {
                    if nqn.is_empty() || nqn.len() > MAX_NQN || allowed == MAX_ALLOW {
                        return None;
                    }
                    allow[allowed] = nqn;
                    allowed += 1;
                }
            }
        }
        Some(Options {
            mib,
            host,
            allow,
            allowed,
            serve_secs,
            ..opts
        })
    }

    /// The host NQNs let in (empty: any host).
    pub fn allowed_hosts(&self) -> &[&'a str] {
        &self.allow[..self.allowed.min(MAX_ALLOW)]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    #[test]
    fn options_from_the_command_line() {
        assert_eq!(
            Options::parse("console=x bvnvmf=10.0.0.2/24 bvnvmf.host=10.0.0.3 bvnvmf.mib=32"),
            Some(Options {
                ip: [10, 0, 0, 2],
                prefix: 24,
                mib: 32,
                host: Some([10, 0, 0, 3]),
                allow: [""; MAX_ALLOW],
                allowed: 0,
                serve_secs: None,
            })
        );
        assert_eq!(
            Options::parse("bvnvmf=10.0.0.2"),
            Some(Options {
                ip: [10, 0, 0, 2],
                prefix: 24,
                mib: DEFAULT_MIB,
                host: None,
                allow: [""; MAX_ALLOW],
                allowed: 0,
                serve_secs: None,
            })
        );
        assert_eq!(
            Options::parse("console=ttyS0 bvnvmf.serve=5"),
            Some(Options {
                ip: DEFAULT_IP,
                prefix: 24,
                mib: DEFAULT_MIB,
                host: None,
                allow: [""; MAX_ALLOW],
                allowed: 0,
                serve_secs: Some(5),
            }),
            "without an address: QEMU's user network's"
        );
        assert_eq!(Options::parse("bvnvmf.serve=-1"), None);
        assert_eq!(Options::parse("bvnvmf=10.0.0.256/24"), None);
        assert_eq!(Options::parse("bvnvmf=10.0.0.2/33"), None);
        assert_eq!(Options::parse("bvnvmf=10.0.0.2 bvnvmf.mib=0"), None);
        assert_eq!(Options::parse("bvnvmf=10.0.0.2 bvnvmf.mib=100000"), None);
        assert_eq!(Options::parse("bvnvmf=10.0.0.2 bvnvmf.host=10.0.0"), None);
    }

    #[test]
    fn allow_list_from_the_command_line() {
        let o = Options::parse("bvnvmf=10.0.0.2 bvnvmf.allow=nqn.a:x,nqn.b:y").unwrap();
        assert_eq!(o.allowed_hosts(), ["nqn.a:x", "nqn.b:y"]);
        let o = Options::parse("bvnvmf=10.0.0.2").unwrap();
        assert!(o.allowed_hosts().is_empty(), "no list: any host");
        assert_eq!(Options::parse("bvnvmf=10.0.0.2 bvnvmf.allow="), None);
        assert_eq!(Options::parse("bvnvmf=10.0.0.2 bvnvmf.allow=a,,b"), None);
        assert_eq!(
            Options::parse("bvnvmf=10.0.0.2 bvnvmf.allow=a,b,c,d,e"),
            None
        );
        let long = "bvnvmf=10.0.0.2 bvnvmf.allow=".to_string() + &"n".repeat(224);
        assert_eq!(Options::parse(&long), None, "longer than an NQN");
        let o = Options::parse("bvnvmf=10.0.0.2 bvnvmf.allow=a,b,c,d").unwrap();
        assert_eq!(o.allowed_hosts().len(), MAX_ALLOW);
    }
}

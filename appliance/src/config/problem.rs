//! What is wrong with a configuration word, and how the console says it.

use core::fmt;

use super::multipath::CNTLID_MAX;
use super::{MAX_ALLOW, MAX_NAMESPACES, MAX_NQN, MAX_NSID, MAX_SUBSYSTEMS, RAM_BLOCK};
use bareverbs_nvmf::target::{ANA_GROUPS, MAX_PEERS};

/// What is wrong with a word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A `bvnvmf…` word the appliance does not know.
    UnknownWord,
    /// A word that may appear once appears again.
    Repeated,
    /// Not an IPv4 address (`A.B.C.D`, each 0 to 255).
    BadAddress,
    /// A prefix length above 32.
    BadPrefix,
    /// A port that is not 1 to 65535.
    BadPort,
    /// A number of seconds that is not 1 to 4294967295.
    BadSeconds,
    /// A size that is not a number of bytes with an optional K, M or G (powers of 1024).
    BadSize,
    /// A size of zero or not a multiple of [`RAM_BLOCK`].
    SizeNotBlocks,
    /// `bvnvmf.mib=` outside 1 to the memory the machine has.
    BadMib,
    /// A namespace that is neither `ram:SIZE`, `blk:N`, `nvme:NSID` nor `nvme:C/NSID`.
    BadMedium,
    /// An NQN that is empty, longer than [`MAX_NQN`], does not start with `nqn.`, or holds a
    /// control character.
    BadNqn,
    /// The discovery subsystem's NQN, which the target serves itself.
    DiscoveryNqn,
    /// A subsystem NQN declared twice.
    DuplicateNqn,
    /// A host NQN twice in one allow list.
    DuplicateHost,
    /// More than [`MAX_SUBSYSTEMS`] subsystems.
    TooManySubsystems,
    /// More than [`MAX_NAMESPACES`] namespaces in one subsystem.
    TooManyNamespaces,
    /// More than [`MAX_ALLOW`] host NQNs in one allow list.
    TooManyHosts,
    /// A `bvnvmf.ns=` word before any `bvnvmf.subsys=`.
    NamespaceOutsideSubsystem,
    /// A `bvnvmf.allow=` word before any `bvnvmf.subsys=` (the built-in subsystems' list) on a
    /// command line that declares subsystems.
    AllowOutsideSubsystem,
    /// `bvnvmf.mib=` (the built-in RAM namespace's size) together with declared subsystems,
    /// whose RAM namespaces give their own sizes.
    MibWithSubsystems,
    /// A subsystem without a namespace.
    NoNamespace,
    /// A `blk:N` the machine does not have (it has the disks of [`Machine::disks`](super::Machine::disks)).
    NoSuchDisk {
        /// How many disks the machine has.
        disks: usize,
    },
    /// A disk that backs a namespace already.
    DiskTaken,
    /// An NVMe namespace the machine does not have (no such controller, or the controller
    /// does not serve that NSID).
    NoSuchNvmeNamespace {
        /// How many NVMe controllers serve namespaces.
        controllers: usize,
    },
    /// An NVMe namespace that backs a namespace already.
    NvmeNamespaceTaken,
    /// A controller ID range that is not `MIN-MAX` with 1 ≤ MIN ≤ MAX ≤ 65519.
    BadCntlidRange,
    /// A number out of its range (a port ID: 0 to 65535).
    BadNumber,
    /// More than [`MAX_PEERS`] peers.
    TooManyPeers,
    /// An NGUID that is not 32 hex digits, an EUI-64 not 16, a UUID not 8-4-4-4-12.
    BadIdentifier,
    /// An identifier another namespace of this appliance has already.
    DuplicateIdentifier,
    /// A namespace identity word (`.nguid=`, `.eui64=`, `.uuid=`, `.anagrp=`) before any
    /// namespace.
    IdentityOutsideNamespace,
    /// An ANA group that is not 1 to [`ANA_GROUPS`].
    BadGroup,
    /// An ANA state word that is not `G:optimized`, `G:non-optimized` or `G:inaccessible`.
    BadAnaState,
    /// `bvnvmf.ana=` before any `bvnvmf.subsys=`.
    AnaOutsideSubsystem,
    /// RAM namespaces larger together than the memory the machine has for them.
    RamTooLarge {
        /// Bytes the namespaces ask for, up to and including this one.
        asked: u64,
        /// Bytes the machine has for them.
        room: u64,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Problem::UnknownWord => write!(
                f,
                "unknown word (known: bvnvmf= .port= .host= .serve= .mib= .subsys= .ns= .allow= .cntlid= .portid= .peer= .nguid= .eui64= .uuid= .anagrp= .ana=)"
            ),
            Problem::Repeated => write!(f, "given twice"),
            Problem::BadAddress => write!(f, "not an IPv4 address A.B.C.D"),
            Problem::BadPrefix => write!(f, "prefix length above 32"),
            Problem::BadPort => write!(f, "not a port from 1 to 65535"),
            Problem::BadSeconds => write!(f, "not a number of seconds from 1 to 4294967295"),
            Problem::BadSize => write!(f, "not a size (bytes, or a number with K, M or G)"),
            Problem::SizeNotBlocks => write!(f, "size zero or not a multiple of {RAM_BLOCK} bytes"),
            Problem::BadMib => write!(f, "not a size in MiB the machine has room for"),
            Problem::BadMedium => {
                write!(
                    f,
                    "a namespace is ram:SIZE, blk:N, nvme:NSID or nvme:C/NSID"
                )
            }
            Problem::BadNqn => write!(
                f,
                "not an NQN (1 to {MAX_NQN} bytes, starting with \"nqn.\", no control characters)"
            ),
            Problem::DiscoveryNqn => write!(f, "the discovery subsystem's NQN is the target's own"),
            Problem::DuplicateNqn => write!(f, "a subsystem with this NQN is declared already"),
            Problem::DuplicateHost => write!(f, "this host NQN is in the subsystem's list already"),
            Problem::TooManySubsystems => write!(f, "more than {MAX_SUBSYSTEMS} subsystems"),
            Problem::TooManyNamespaces => {
                write!(f, "more than {MAX_NAMESPACES} namespaces in one subsystem")
            }
            Problem::TooManyHosts => write!(f, "more than {MAX_ALLOW} host NQNs in one subsystem"),
            Problem::NamespaceOutsideSubsystem => {
                write!(
                    f,
                    "a namespace before any bvnvmf.subsys= (it belongs to the subsystem before it)"
                )
            }
            Problem::AllowOutsideSubsystem => write!(
                f,
                "a host list before any bvnvmf.subsys= is the built-in subsystems'; put it after the subsystem it is for"
            ),
            Problem::MibWithSubsystems => write!(
                f,
                "bvnvmf.mib= sizes the built-in RAM namespace; with bvnvmf.subsys= each ram:SIZE gives its own"
            ),
            Problem::NoNamespace => {
                write!(f, "the subsystem has no namespace (bvnvmf.ns= after it)")
            }
            Problem::NoSuchDisk { disks } => {
                write!(f, "no such virtio-blk disk (the machine has {disks})")
            }
            Problem::DiskTaken => write!(f, "the disk backs another namespace already"),
            Problem::NoSuchNvmeNamespace { controllers } => write!(
                f,
                "no such NVMe namespace ({controllers} NVMe controllers with namespaces; NSIDs 1 to {MAX_NSID})"
            ),
            Problem::NvmeNamespaceTaken => {
                write!(f, "the NVMe namespace backs another namespace already")
            }
            Problem::BadCntlidRange => {
                write!(
                    f,
                    "not a controller ID range MIN-MAX (1 <= MIN <= MAX <= {CNTLID_MAX})"
                )
            }
            Problem::BadNumber => write!(f, "not a number from 0 to 65535"),
            Problem::TooManyPeers => write!(f, "more than {MAX_PEERS} peers"),
            Problem::BadIdentifier => write!(
                f,
                "an NGUID is 32 hex digits, an EUI-64 16, a UUID 8-4-4-4-12"
            ),
            Problem::DuplicateIdentifier => {
                write!(f, "another namespace has this identifier already")
            }
            Problem::IdentityOutsideNamespace => write!(
                f,
                "a namespace identity before any bvnvmf.ns= (it belongs to the namespace before it)"
            ),
            Problem::BadGroup => write!(f, "not an ANA group from 1 to {ANA_GROUPS}"),
            Problem::BadAnaState => write!(
                f,
                "an ANA state is G:optimized, G:non-optimized or G:inaccessible"
            ),
            Problem::AnaOutsideSubsystem => write!(
                f,
                "an ANA state before any bvnvmf.subsys= (it belongs to the subsystem before it)"
            ),
            Problem::RamTooLarge { asked, room } => write!(
                f,
                "RAM namespaces need {asked} bytes together, the machine has {room} for them"
            ),
        }
    }
}

//! Landlock: the file system the command may read and write, and (with
//! the network off) no TCP bind or connect, no abstract UNIX socket of
//! the outside, no signal to the outside.
//!
//! Landlock only grants, beneath a directory; it cannot take a file back
//! out of a granted one. A protected file (toolwire's database, its
//! config) inside a granted directory is therefore carved out: that
//! directory is granted listing only, and each of its other entries is
//! granted one by one (recursing into the ones that hold a protected
//! file further down). The cost: nothing new can be made, removed or
//! renamed directly in such a directory, as there is no grant on it.

use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, LandlockStatus,
    PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetStatus,
    Scope,
};

use crate::policy::{Invocation, Mode};

/// The newest ABI whose rights toolwire asks for; the crate leaves out
/// what an older kernel lacks (best effort).
const ABI_WANTED: ABI = ABI::V6;

/// Read and run, system-wide.
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc", "/sys",
];

/// Device nodes commands open for reading and writing.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
];

/// Secrets of the system that sit in the readable `/etc`.
const SYSTEM_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/security/opasswd",
];

/// Applies the rules to this process. `Ok(false)`: the kernel enforced
/// none of them (no Landlock).
pub(super) fn restrict(invocation: &Invocation) -> Result<bool, String> {
    let policy = &invocation.policy;
    let read = AccessFs::from_read(ABI_WANTED);
    let all = AccessFs::from_all(ABI_WANTED);
    let write_access = match policy.mode {
        Mode::WorkspaceWrite => all,
        Mode::ReadOnly | Mode::Full => read,
    };
    let mut protected: Vec<PathBuf> = policy.protected.clone();
    protected.extend(SYSTEM_SECRETS.iter().map(PathBuf::from));
    protected.extend(ssh_host_keys());

    let mut rules: Vec<Rule> = Vec::new();
    // The system's own links (`/etc/resolv.conf` into `/run`) are
    // followed out of the directory, read-only; no one else's are.
    for dir in SYSTEM {
        let dir = Path::new(dir);
        carve(&mut rules, dir, dir, None, read, &protected, true, 0);
    }
    let mut grants: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
    for dir in &invocation.toolchains {
        grants.push((dir.clone(), read));
    }
    for dir in &policy.read {
        grants.push((dir.clone(), read));
    }
    grants.push((invocation.workspace.clone(), write_access));
    grants.push((invocation.temp_dir.clone(), write_access));
    for dir in &policy.write {
        grants.push((dir.clone(), write_access));
    }

    for (path, access) in grants {
        carve(&mut rules, &path, &path, None, access, &protected, false, 0);
    }
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    for dev in DEVICES {
        rules.push(Rule {
            path: PathBuf::from(dev),
            dir: Some(false),
            access: device,
        });
    }

    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(|e| format!("Landlock: {e}"))?;
    if !policy.network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .and_then(|r| r.scope(Scope::AbstractUnixSocket))
            .map_err(|e| format!("Landlock: {e}"))?;
    }
    let mut created = ruleset
        .scope(Scope::Signal)
        .and_then(Ruleset::create)
        .map_err(|e| format!("Landlock: {e}"))?;
    for rule in rules {
        add(&mut created, rule)?;
    }
    let status = created
        .restrict_self()
        .map_err(|e| format!("Landlock: {e}"))?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

/// A path granted `access`; `dir` when its listing already told whether
/// it is a directory (a carve-out of `/etc` grants some 170 entries: each
/// `stat` saved counts, as every command pays for them).
struct Rule {
    path: PathBuf,
    dir: Option<bool>,
    access: BitFlags<AccessFs>,
}

/// One grant, with every protected path inside it carved out.
#[allow(clippy::too_many_arguments)]
fn carve(
    rules: &mut Vec<Rule>,
    root: &Path,
    path: &Path,
    dir: Option<bool>,
    access: BitFlags<AccessFs>,
    protected: &[PathBuf],
    follow_out: bool,
    depth: usize,
) {
    if protected.iter().any(|p| p == path) {
        return;
    }
    let inside = protected.iter().any(|p| p.starts_with(path));
    if !inside || depth > 32 {
        rules.push(Rule {
            path: path.to_path_buf(),
            dir,
            access,
        });
        return;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return;
    };
    // Listing the directory shows names only, never contents.
    if access.contains(AccessFs::ReadDir) {
        rules.push(Rule {
            path: path.to_path_buf(),
            dir: Some(true),
            access: BitFlags::from(AccessFs::ReadDir),
        });
    }
    for entry in entries.filter_map(Result::ok) {
        // The listing's own file type: no `stat` (std falls back to one
        // where the file system does not say).
        let file_type = entry.file_type().ok();
        let entry = entry.path();
        // A rule follows a symlink to its target: judge the target, so a
        // link to the database is not a way in, and grant it only inside
        // the directory granted (a link out of it grants nothing, as the
        // whole directory's rule would not have).
        let (target, dir) = match file_type {
            Some(t) if !t.is_symlink() => (entry, Some(t.is_dir())),
            _ => match std::fs::canonicalize(&entry) {
                Ok(target) if follow_out || target.starts_with(root) => (target, None),
                _ => continue,
            },
        };
        carve(
            rules,
            root,
            &target,
            dir,
            access,
            protected,
            follow_out,
            depth + 1,
        );
    }
}

fn add(created: &mut RulesetCreated, rule: Rule) -> Result<(), String> {
    let Rule { path, dir, access } = rule;
    // Directories named but missing on this system are skipped.
    let dir = match dir {
        Some(dir) => dir,
        None => match std::fs::metadata(&path) {
            Ok(meta) => meta.is_dir(),
            Err(_) => return Ok(()),
        },
    };
    let access = if dir {
        access
    } else {
        access & AccessFs::from_file(ABI_WANTED)
    };
    let Ok(fd) = PathFd::new(&path) else {
        return Ok(());
    };
    created
        .add_rule(PathBeneath::new(fd, access))
        .map(|_| ())
        .map_err(|e| format!("Landlock rule for {}: {e}", path.display()))
}

/// `/etc/ssh/ssh_host_*_key`: the private host keys.
fn ssh_host_keys() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/etc/ssh") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ssh_host_") && n.ends_with("_key"))
        })
        .collect()
}

/// The kernel's Landlock ABI, found by enforcing an empty ruleset on this
/// (probing, about to exit) process.
pub(super) fn probe() -> Option<i32> {
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI::V1))
        .and_then(Ruleset::create)
        .and_then(RulesetCreated::restrict_self)
        .ok()?;
    match status.landlock {
        LandlockStatus::Available {
            effective_abi,
            kernel_abi,
        } => Some(kernel_abi.unwrap_or(effective_abi as i32)),
        _ => None,
    }
}

//! Opening paths beneath the workspace root with the kernel's help.
//!
//! [`Workspace::resolve`](super::Workspace::resolve) judges a path by
//! name and follows the symlinks on it, so the path it returns has none.
//! Between that check and the open, someone may swap a directory on the
//! path for a symlink to the outside. So every open here starts from the
//! root's directory fd and refuses to follow *any* symlink: on Linux ≥ 5.6
//! with one `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS)`, elsewhere (older kernels, seccomp filters that
//! answer `ENOSYS`) one `openat(O_NOFOLLOW)` per component, which holds the
//! same guarantee because the path has no `..` and no symlink to follow.
//! A swap then fails the open ([`Opened::Moved`]) instead of leaving the
//! root.
//!
//! Files are first opened with `O_PATH` (which opens no device and never
//! blocks) and their type checked on the fd: FIFOs, devices and sockets
//! are refused before anything reads from them.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};
#[cfg(target_os = "linux")]
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

/// What a path beneath the root turned out to be.
#[derive(Debug)]
pub(crate) enum Opened {
    /// A regular file, open for reading, with its length.
    File(File, u64),
    /// A directory, open for listing.
    Dir(OwnedFd),
    /// Something the tools never read: a FIFO, a device, a socket.
    Special(&'static str),
    /// A symlink appeared on the path after it was checked (or the path
    /// would otherwise leave the root): refused, nothing was opened.
    Moved,
    Missing(io::Error),
}

/// Set once `openat2` answered `ENOSYS`: the kernel (or a seccomp filter)
/// lacks it, so the component walk is used from then on.
#[cfg(target_os = "linux")]
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// Opens `rel` (relative, without `..` or symlinks; empty for the root
/// itself) beneath `root` with `flags`, following no symlink at all.
pub(crate) fn open(root: BorrowedFd<'_>, rel: &Path, flags: OFlags) -> io::Result<OwnedFd> {
    let mut flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    // openat2 refuses O_PATH with any flag beyond these (EINVAL).
    if !flags.contains(OFlags::PATH) {
        flags |= OFlags::NOCTTY;
    }
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    #[cfg(target_os = "linux")]
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        use rustix::fs::ResolveFlags;
        let resolve =
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        // EAGAIN: a concurrent rename anywhere on the system made the
        // kernel unsure; it asks for a retry.
        for _ in 0..8 {
            match rustix::fs::openat2(root, rel, flags, Mode::empty(), resolve) {
                Err(rustix::io::Errno::AGAIN) => continue,
                Err(rustix::io::Errno::NOSYS) => {
                    NO_OPENAT2.store(true, Ordering::Relaxed);
                    break;
                }
                // Old container seccomp profiles answer EPERM to system
                // calls they do not know; the walk says whether it is real.
                Err(rustix::io::Errno::PERM) => return walk(root, rel, flags, false),
                other => return other.map_err(io::Error::from),
            }
        }
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            return Err(io::Error::from(rustix::io::Errno::AGAIN));
        }
    }
    walk(root, rel, flags, false)
}

/// Component by component, each `openat(O_NOFOLLOW)` relative to the
/// previous directory: never leaves `root` since `rel` has no `..`.
/// With `create`, missing directories are made on the way.
fn walk(root: BorrowedFd<'_>, rel: &Path, flags: OFlags, create: bool) -> io::Result<OwnedFd> {
    let names = names(rel)?;
    let dir_flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut current: Option<OwnedFd> = None;
    let Some((last, parents)) = names.split_last() else {
        return rustix::fs::openat(root, ".", flags, Mode::empty()).map_err(io::Error::from);
    };
    for name in parents {
        let at = current.as_ref().map_or(root, |fd| fd.as_fd());
        let next = match rustix::fs::openat(at, *name, dir_flags, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) if create => {
                match rustix::fs::mkdirat(at, *name, Mode::from_raw_mode(0o777)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                rustix::fs::openat(at, *name, dir_flags, Mode::empty())?
            }
            other => other?,
        };
        current = Some(next);
    }
    let at = current.as_ref().map_or(root, |fd| fd.as_fd());
    let fd = match rustix::fs::openat(at, *last, flags, Mode::empty()) {
        Err(rustix::io::Errno::NOENT) if create => {
            match rustix::fs::mkdirat(at, *last, Mode::from_raw_mode(0o777)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
            rustix::fs::openat(at, *last, flags, Mode::empty())?
        }
        other => other?,
    };
    Ok(fd)
}

fn names(rel: &Path) -> io::Result<Vec<&OsStr>> {
    rel.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a plain relative path",
            )),
        })
        .collect()
}

/// Whether an open failed because the path changed under us into
/// something that leads elsewhere (a symlink, or out of the root).
pub(crate) fn is_moved(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(rustix::io::Errno::from_raw_os_error),
        Some(rustix::io::Errno::LOOP | rustix::io::Errno::XDEV)
    )
}

/// Looks at `rel` without opening what it names, then opens it for
/// reading if it is a regular file or a directory.
pub(crate) fn open_node(root: BorrowedFd<'_>, rel: &Path) -> io::Result<Opened> {
    let path_fd = match open(root, rel, OFlags::PATH) {
        Ok(fd) => fd,
        Err(e) if is_moved(&e) => return Ok(Opened::Moved),
        Err(e) if is_missing(&e) => return Ok(Opened::Missing(e)),
        Err(e) => return Err(e),
    };
    let stat = rustix::fs::fstat(&path_fd)?;
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => {
            let dir = rustix::fs::openat(
                &path_fd,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            Ok(Opened::Dir(dir))
        }
        FileType::RegularFile => {
            // An O_PATH fd cannot be read; open again, without blocking
            // in case the name was swapped for a FIFO meanwhile, and make
            // sure it is still the file that was checked.
            let fd = match open(root, rel, OFlags::RDONLY | OFlags::NONBLOCK) {
                Ok(fd) => fd,
                Err(e) if is_moved(&e) => return Ok(Opened::Moved),
                Err(e) => return Err(e),
            };
            let again = rustix::fs::fstat(&fd)?;
            if !same_file(&stat, &again) {
                return Ok(Opened::Moved);
            }
            let len = u64::try_from(again.st_size).unwrap_or(0);
            Ok(Opened::File(File::from(fd), len))
        }
        FileType::Symlink => Ok(Opened::Moved),
        other => Ok(Opened::Special(kind_name(other))),
    }
}

fn same_file(a: &Stat, b: &Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

pub(crate) fn is_missing(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// How a refusal names a file type.
pub(crate) fn kind_name(kind: FileType) -> &'static str {
    match kind {
        FileType::Fifo => "a FIFO (named pipe)",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Socket => "a socket",
        FileType::Symlink => "a symbolic link",
        FileType::Directory => "a directory",
        FileType::RegularFile => "a regular file",
        FileType::Unknown => "a file of unknown type",
    }
}

/// The directory that holds `rel`, opened beneath `root` (made, with its
/// missing parents, when `create`), and the name `rel` has in it.
pub(crate) fn open_parent(
    root: BorrowedFd<'_>,
    rel: &Path,
    create: bool,
) -> io::Result<(OwnedFd, OsString)> {
    let name = rel
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?
        .to_os_string();
    let parent = rel.parent().unwrap_or(Path::new(""));
    let flags = OFlags::RDONLY | OFlags::DIRECTORY;
    let dir = match open(root, parent, flags) {
        Err(e) if create && is_missing(&e) => walk(
            root,
            parent,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            true,
        )?,
        other => other?,
    };
    Ok((dir, name))
}

/// What is at `name` in `dir` now, without following a symlink.
pub(crate) fn kind_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<(FileType, Mode)>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some((
            FileType::from_raw_mode(stat.st_mode),
            Mode::from_raw_mode(stat.st_mode),
        ))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes `bytes` to a temporary file in `dir` and renames it over `name`
/// (both relative to `dir`, so a swapped parent cannot redirect them):
/// readers never see a half-written file, a failed write leaves the old
/// content, and a symlink at `name` is replaced, never written through.
/// An existing file's permissions are kept.
pub(crate) fn atomic_write_at(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    tmp: &OsStr,
    keep_mode: Option<Mode>,
    bytes: &[u8],
) -> io::Result<()> {
    use std::io::Write;
    let fd = rustix::fs::openat(
        dir,
        tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o666),
    )?;
    let result = (|| {
        let mut file = File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        if let Some(mode) = keep_mode {
            rustix::fs::fchmod(&file, mode)?;
        }
        drop(file);
        rustix::fs::renameat(dir, tmp, dir, name)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
    }
    result
}

/// The entries of an open directory: names (without `.` and `..`) with
/// their type, not following symlinks.
pub(crate) fn entries(dir: &OwnedFd) -> io::Result<Vec<(OsString, FileType)>> {
    let mut out = Vec::new();
    let mut reader = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => kind_at(dir.as_fd(), name)?
                .map(|(kind, _)| kind)
                .unwrap_or(FileType::Unknown),
            kind => kind,
        };
        out.push((name.to_os_string(), kind));
    }
    Ok(out)
}

/// Opens the subdirectory `name` of `dir`, not through a symlink.
pub(crate) fn open_subdir(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    fn root(dir: &Path) -> OwnedFd {
        OwnedFd::from(File::open(dir).unwrap())
    }

    /// The component walk (kernels without openat2) follows no symlink,
    /// final or not, and makes missing directories only when asked.
    #[test]
    fn the_fallback_walk_follows_no_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::fs::write(dir.path().join("d/f.txt"), "inside").unwrap();
        std::fs::write(outside.path().join("f.txt"), "outside").unwrap();
        symlink(outside.path(), dir.path().join("link")).unwrap();
        symlink(outside.path().join("f.txt"), dir.path().join("d/to_f")).unwrap();
        let root = root(dir.path());
        let read = OFlags::RDONLY;

        let fd = walk(root.as_fd(), Path::new("d/f.txt"), read, false).unwrap();
        assert_eq!(std::io::read_to_string(File::from(fd)).unwrap(), "inside");
        let flags = read | OFlags::NOFOLLOW;
        for through in ["link/f.txt", "d/to_f"] {
            let e = walk(root.as_fd(), Path::new(through), flags, false).unwrap_err();
            assert!(is_moved(&e) || is_missing(&e), "{through}: {e}");
        }
        assert!(walk(root.as_fd(), Path::new("../x"), read, false).is_err());

        let dirs = OFlags::RDONLY | OFlags::DIRECTORY;
        assert!(walk(root.as_fd(), Path::new("n/e/w"), dirs, false).is_err());
        walk(root.as_fd(), Path::new("n/e/w"), dirs, true).unwrap();
        assert!(dir.path().join("n/e/w").is_dir());
        // Creating through a symlinked directory is refused, not followed.
        assert!(walk(root.as_fd(), Path::new("link/new"), dirs, true).is_err());
        assert!(!outside.path().join("new").exists());
    }

    #[test]
    fn special_files_are_named_without_being_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let root = root(dir.path());
        match open_node(root.as_fd(), Path::new("fifo")).unwrap() {
            Opened::Special(kind) => assert_eq!(kind, "a FIFO (named pipe)"),
            other => panic!("{other:?}"),
        }
    }
}

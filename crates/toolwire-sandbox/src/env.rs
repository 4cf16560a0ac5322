//! The command's environment, built from an allow-list rather than
//! inherited, and the toolchain directories it points at.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// Passed through when set: what shells and build tools need to behave
/// (locale, terminal, who and where the user is) and where toolchains
/// live. Secrets are never named here; `TOOLWIRE_*` and provider keys
/// cannot be added through the config either.
const ALLOWED: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LANGUAGE",
    "TERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "PYENV_ROOT",
    "PYENV_VERSION",
];

/// Names never passed, even when configured: toolwire's own settings and
/// keys, and the providers' keys.
pub fn forbidden(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("TOOLWIRE_")
        || matches!(
            upper.as_str(),
            "OPENAI_API_KEY" | "ANTHROPIC_API_KEY" | "TMPDIR"
        )
}

/// What of `from` a process toolwire starts may inherit: the allow-list,
/// `LC_*` and the configured `extra` names, minus [`forbidden`] ones.
pub fn passed(
    from: impl IntoIterator<Item = (OsString, OsString)>,
    extra: &[String],
) -> Vec<(OsString, OsString)> {
    from.into_iter()
        .filter(|(name, _)| {
            let Some(name) = name.to_str() else {
                return false;
            };
            !forbidden(name)
                && (ALLOWED.contains(&name)
                    || name.starts_with("LC_")
                    || extra.iter().any(|e| e == name))
        })
        .collect()
}

/// The environment of a confined command: what [`passed`] lets through,
/// and `TMPDIR` (with `TMP`, `TEMP`) set to the call's temp dir.
pub fn build(
    from: impl IntoIterator<Item = (OsString, OsString)>,
    extra: &[String],
    temp_dir: &Path,
) -> Vec<(OsString, OsString)> {
    let mut env = passed(from, extra);
    for name in ["TMPDIR", "TMP", "TEMP"] {
        env.push((name.into(), temp_dir.as_os_str().to_owned()));
    }
    env
}

/// Directories the command needs to read to run the tools on its `PATH`:
/// for each entry outside the system directories, the toolchain's root
/// (`~/.cargo` for `~/.cargo/bin`, `~/.pyenv` for `~/.pyenv/shims`), and
/// the homes rustup, cargo and pyenv use by default when they exist.
pub fn toolchains(env: &[(OsString, OsString)]) -> Vec<PathBuf> {
    let get = |key: &str| {
        env.iter()
            .find(|(k, _)| k == OsStr::new(key))
            .map(|(_, v)| v.clone())
    };
    let home = get("HOME").map(PathBuf::from);
    let mut found: Vec<PathBuf> = Vec::new();
    if let Some(path) = get("PATH") {
        for entry in std::env::split_paths(&path) {
            if !entry.is_absolute() || system(&entry) {
                continue;
            }
            found.push(root_of(&entry, home.as_deref()));
        }
    }
    for key in ["CARGO_HOME", "RUSTUP_HOME", "PYENV_ROOT"] {
        if let Some(dir) = get(key) {
            found.push(PathBuf::from(dir));
        }
    }
    if let Some(home) = &home {
        for dir in [".cargo", ".rustup", ".pyenv"] {
            found.push(home.join(dir));
        }
    }
    found.retain(|dir| dir.exists() && Some(dir.as_path()) != home.as_deref());
    found.sort();
    found.dedup();
    found
}

/// Covered by the system grants already.
fn system(dir: &Path) -> bool {
    [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    ]
    .iter()
    .any(|root| dir.starts_with(root))
}

/// `X/bin` and `X/shims` → `X`, unless `X` is the home directory or
/// `~/.local` (whose siblings are other programs' data): then the entry
/// itself. Anything else: the entry.
fn root_of(entry: &Path, home: Option<&Path>) -> PathBuf {
    let leaf = entry.file_name().and_then(OsStr::to_str);
    let walk_up = matches!(leaf, Some("bin" | "shims"));
    match entry.parent() {
        Some(parent)
            if walk_up
                && Some(parent) != home
                && home.is_none_or(|h| parent != h.join(".local"))
                && parent != Path::new("/") =>
        {
            // pyenv's plugin shims live at ~/.pyenv/plugins/X/shims.
            match home {
                Some(h) if parent.starts_with(h) => {
                    let mut top = h.to_path_buf();
                    if let Some(first) = parent.strip_prefix(h).ok().and_then(|r| r.iter().next()) {
                        top.push(first);
                    }
                    if top == h.join(".local") {
                        parent.to_path_buf()
                    } else {
                        top
                    }
                }
                _ => parent.to_path_buf(),
            }
        }
        _ => entry.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn keys_never_pass_and_tmpdir_is_the_calls() {
        let from = [
            ("PATH", "/usr/bin"),
            ("OPENAI_API_KEY", "sk-1"),
            ("ANTHROPIC_API_KEY", "sk-2"),
            ("TOOLWIRE_API_KEYS", "k"),
            ("LC_ALL", "C"),
            ("MY_VAR", "x"),
            ("OTHER", "y"),
            ("TMPDIR", "/somewhere"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let extra = vec![
            "MY_VAR".to_owned(),
            "OPENAI_API_KEY".to_owned(),
            "TOOLWIRE_DB".to_owned(),
        ];
        let env = build(from, &extra, Path::new("/t/x"));
        let names: Vec<&str> = env.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(names, ["PATH", "LC_ALL", "MY_VAR", "TMPDIR", "TMP", "TEMP"]);
        assert!(env.iter().all(|(_, v)| v != "/somewhere"));
    }

    #[test]
    fn toolchain_roots() {
        let home = Some(Path::new("/h"));
        assert_eq!(
            root_of(Path::new("/h/.cargo/bin"), home),
            Path::new("/h/.cargo")
        );
        assert_eq!(
            root_of(Path::new("/h/.pyenv/shims"), home),
            Path::new("/h/.pyenv")
        );
        assert_eq!(
            root_of(Path::new("/h/.pyenv/plugins/pyenv-virtualenv/shims"), home),
            Path::new("/h/.pyenv")
        );
        assert_eq!(
            root_of(Path::new("/h/.local/bin"), home),
            Path::new("/h/.local/bin")
        );
        assert_eq!(root_of(Path::new("/h/bin"), home), Path::new("/h/bin"));
        assert_eq!(
            root_of(Path::new("/opt/go/bin"), home),
            Path::new("/opt/go")
        );
        assert_eq!(root_of(Path::new("/snap/bin"), home), Path::new("/snap"));
    }
}

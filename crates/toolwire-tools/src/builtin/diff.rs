//! A unified-diff parser and applier for one file.
//!
//! Written here rather than taken from a crate because the crates on offer
//! (e.g. `diffy`) apply hunks only at their stated line numbers, while
//! model-written diffs are often off by a few lines or have wrong counts.
//! Rules: context must match exactly (trailing whitespace aside), a hunk
//! may move from its stated position (nearest match wins), hunks apply in
//! order without overlapping, and nothing is returned unless all apply.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Line {
    Context(String),
    Remove(String),
    Add(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Hunk {
    /// The `@@ … @@` line, to name the hunk in errors.
    pub header: String,
    /// 1-based start in the old file; `None` for a bare `@@ @@`.
    pub old_start: Option<usize>,
    pub lines: Vec<Line>,
    /// `\ No newline at end of file` followed the last old / new line.
    pub old_no_eol: bool,
    pub new_no_eol: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Patch {
    /// `--- /dev/null`: the diff creates the file.
    pub creates: bool,
    pub hunks: Vec<Hunk>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DiffError(pub String);

impl fmt::Display for DiffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(message: impl Into<String>) -> Result<T, DiffError> {
    Err(DiffError(message.into()))
}

pub(crate) fn parse(diff: &str) -> Result<Patch, DiffError> {
    let lines: Vec<&str> = diff
        .lines()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let mut patch = Patch {
        creates: false,
        hunks: Vec::new(),
    };
    let mut files = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if is_file_header(&lines, i) {
            files += 1;
            if files > 1 {
                return err("the diff changes more than one file; send one diff per file");
            }
            patch.creates = header_path(line) == "/dev/null";
            if header_path(lines[i + 1]) == "/dev/null" {
                return err("the diff deletes the file; apply_diff does not delete files");
            }
            i += 2;
        } else if line.starts_with("@@") {
            let (hunk, next) = parse_hunk(&lines, i)?;
            patch.hunks.push(hunk);
            i = next;
        } else if patch.hunks.is_empty() {
            // Preamble (`diff --git`, `index …`) carries nothing we need.
            i += 1;
        } else {
            return err(format!(
                "line {} of the diff (`{line}`) is neither a hunk line nor a header",
                i + 1
            ));
        }
    }
    if patch.hunks.is_empty() {
        return err("the diff has no hunks (`@@ -a,b +c,d @@` lines)");
    }
    Ok(patch)
}

/// `--- ` starts a header only when `+++ ` follows, so a removed line
/// beginning with `-- ` (SQL, Lua comments) is not mistaken for one.
fn is_file_header(lines: &[&str], i: usize) -> bool {
    lines[i].starts_with("--- ") && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ "))
}

fn header_path(line: &str) -> &str {
    let rest = &line[4..];
    rest.split('\t').next().unwrap_or(rest).trim()
}

fn parse_hunk(lines: &[&str], start: usize) -> Result<(Hunk, usize), DiffError> {
    let header = lines[start];
    let counts = parse_header(header)?;
    let mut hunk = Hunk {
        header: header.trim_end().to_owned(),
        old_start: counts.map(|c| c.0),
        lines: Vec::new(),
        old_no_eol: false,
        new_no_eol: false,
    };
    let mut i = start + 1;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with("@@") || is_file_header(lines, i) || line.starts_with("diff ") {
            break;
        }
        match line.as_bytes().first() {
            Some(b' ') => hunk.lines.push(Line::Context(line[1..].to_owned())),
            // Editors and models often strip the space of an empty context line.
            None => hunk.lines.push(Line::Context(String::new())),
            Some(b'-') => hunk.lines.push(Line::Remove(line[1..].to_owned())),
            Some(b'+') => hunk.lines.push(Line::Add(line[1..].to_owned())),
            Some(b'\\') => match hunk.lines.last() {
                Some(Line::Context(_)) => (hunk.old_no_eol, hunk.new_no_eol) = (true, true),
                Some(Line::Remove(_)) => hunk.old_no_eol = true,
                Some(Line::Add(_)) => hunk.new_no_eol = true,
                None => {}
            },
            Some(_) => {
                return err(format!(
                    "line {} of the diff (`{line}`) in hunk `{}` does not start with ' ', '-' or '+'",
                    i + 1,
                    hunk.header
                ));
            }
        }
        i += 1;
    }
    if let Some((_, old_count, _, new_count)) = counts {
        trim_trailing_blank_context(&mut hunk, old_count, new_count);
    }
    if hunk.lines.is_empty() {
        return err(format!("hunk `{}` is empty", hunk.header));
    }
    Ok((hunk, i))
}

/// A blank line after a hunk is usually a separator, not an empty context
/// line; the header's counts tell which, when they are right.
fn trim_trailing_blank_context(hunk: &mut Hunk, old_count: usize, new_count: usize) {
    while let Some(Line::Context(text)) = hunk.lines.last() {
        let old = hunk
            .lines
            .iter()
            .filter(|l| !matches!(l, Line::Add(_)))
            .count();
        let new = hunk
            .lines
            .iter()
            .filter(|l| !matches!(l, Line::Remove(_)))
            .count();
        if text.is_empty() && old > old_count && new > new_count {
            hunk.lines.pop();
        } else {
            break;
        }
    }
}

type Counts = (usize, usize, usize, usize);

/// `@@ -a[,b] +c[,d] @@ section`, or a bare `@@ @@` (position unknown).
fn parse_header(header: &str) -> Result<Option<Counts>, DiffError> {
    let bad = || {
        DiffError(format!(
            "bad hunk header `{header}` (expected `@@ -a,b +c,d @@`)"
        ))
    };
    let inner = header
        .strip_prefix("@@")
        .and_then(|rest| rest.split("@@").next())
        .ok_or_else(bad)?
        .trim();
    if inner.is_empty() {
        return Ok(None);
    }
    let mut parts = inner.split_whitespace();
    let old = parts
        .next()
        .and_then(|p| p.strip_prefix('-'))
        .ok_or_else(bad)?;
    let new = parts
        .next()
        .and_then(|p| p.strip_prefix('+'))
        .ok_or_else(bad)?;
    let range = |s: &str| -> Option<(usize, usize)> {
        match s.split_once(',') {
            Some((start, count)) => Some((start.parse().ok()?, count.parse().ok()?)),
            None => Some((s.parse().ok()?, 1)),
        }
    };
    let (old_start, old_count) = range(old).ok_or_else(bad)?;
    let (new_start, new_count) = range(new).ok_or_else(bad)?;
    Ok(Some((old_start, old_count, new_start, new_count)))
}

/// A file as lines, remembering its line ending and final newline so an
/// edit does not change them.
pub(crate) struct Text {
    pub lines: Vec<String>,
    pub crlf: bool,
    pub final_newline: bool,
}

impl Text {
    pub fn parse(content: &str) -> Text {
        let crlf = content.contains("\r\n");
        let final_newline = content.is_empty() || content.ends_with('\n');
        let lines = content
            .lines()
            .map(|l| l.strip_suffix('\r').unwrap_or(l).to_owned())
            .collect();
        Text {
            lines,
            crlf,
            final_newline,
        }
    }

    pub fn render(&self) -> String {
        let eol = if self.crlf { "\r\n" } else { "\n" };
        let mut out = self.lines.join(eol);
        if self.final_newline && !self.lines.is_empty() {
            out.push_str(eol);
        }
        out
    }
}

/// Where each hunk landed, for the report.
pub(crate) struct Applied {
    pub text: Text,
    /// (1-based line in the old file, offset from the stated line).
    pub positions: Vec<(usize, isize)>,
}

pub(crate) fn apply(patch: &Patch, old: &Text) -> Result<Applied, DiffError> {
    let mut out: Vec<String> = Vec::with_capacity(old.lines.len());
    let mut positions = Vec::new();
    let mut final_newline = old.final_newline;
    let mut cursor = 0;
    for (n, hunk) in patch.hunks.iter().enumerate() {
        let wanted: Vec<&str> = hunk
            .lines
            .iter()
            .filter_map(|l| match l {
                Line::Context(t) | Line::Remove(t) => Some(t.as_str()),
                Line::Add(_) => None,
            })
            .collect();
        let stated = stated_index(hunk, wanted.is_empty());
        let at = find(&old.lines, &wanted, stated, cursor)
            .ok_or_else(|| mismatch(n + 1, hunk, &old.lines, &wanted, stated.max(cursor)))?;
        out.extend(old.lines[cursor..at].iter().cloned());
        let mut i = at;
        for line in &hunk.lines {
            match line {
                Line::Context(_) => {
                    // Keep the file's own line: the match may have ignored
                    // trailing whitespace.
                    out.push(old.lines[i].clone());
                    i += 1;
                }
                Line::Remove(_) => i += 1,
                Line::Add(t) => out.push(t.clone()),
            }
        }
        if i == old.lines.len() {
            if hunk.new_no_eol {
                final_newline = false;
            } else if hunk.old_no_eol || (!old.final_newline && hunk_touches_end(hunk)) {
                final_newline = true;
            }
        }
        positions.push((at + 1, at as isize - stated as isize));
        cursor = i;
    }
    out.extend(old.lines[cursor..].iter().cloned());
    Ok(Applied {
        text: Text {
            lines: out,
            crlf: old.crlf,
            final_newline,
        },
        positions,
    })
}

/// A hunk that ends by adding lines at the end of a file without a final
/// newline gives it one (the `\` marker would say otherwise).
fn hunk_touches_end(hunk: &Hunk) -> bool {
    matches!(hunk.lines.last(), Some(Line::Add(_)))
}

fn stated_index(hunk: &Hunk, pure_insert: bool) -> usize {
    match hunk.old_start {
        // `-5,0` means "after line 5"; `-5,3` means "starting at line 5".
        Some(start) if pure_insert => start,
        Some(start) => start.saturating_sub(1),
        None => 0,
    }
}

/// The match nearest to `stated` at or after `cursor`: exact first, then
/// ignoring trailing whitespace.
fn find(lines: &[String], wanted: &[&str], stated: usize, cursor: usize) -> Option<usize> {
    if wanted.is_empty() {
        return Some(stated.clamp(cursor, lines.len()));
    }
    let last = lines.len().checked_sub(wanted.len())?;
    if cursor > last {
        return None;
    }
    let exact = |at: usize| lines[at..].iter().zip(wanted).all(|(a, b)| a == b);
    let loose = |at: usize| {
        lines[at..]
            .iter()
            .zip(wanted)
            .all(|(a, b)| a.trim_end() == b.trim_end())
    };
    nearest(stated, cursor, last, exact).or_else(|| nearest(stated, cursor, last, loose))
}

fn nearest(stated: usize, lo: usize, hi: usize, matches: impl Fn(usize) -> bool) -> Option<usize> {
    let stated = stated.clamp(lo, hi);
    let reach = (stated - lo).max(hi - stated);
    (0..=reach).find_map(|d| {
        [stated.checked_sub(d), stated.checked_add(d)]
            .into_iter()
            .flatten()
            .find(|&at| at >= lo && at <= hi && matches(at))
    })
}

fn mismatch(n: usize, hunk: &Hunk, lines: &[String], wanted: &[&str], at: usize) -> DiffError {
    let what = match wanted
        .iter()
        .enumerate()
        .find(|&(k, w)| lines.get(at + k).map(String::as_str) != Some(*w))
    {
        Some((k, w)) => match lines.get(at + k) {
            Some(found) => format!("at line {} expected `{w}` but found `{found}`", at + k + 1),
            None => format!(
                "expected `{w}` at line {} but the file has only {} lines",
                at + k + 1,
                lines.len()
            ),
        },
        None => "its lines overlap an earlier hunk".into(),
    };
    DiffError(format!(
        "hunk {n} (`{}`) does not apply: its context and removed lines were not found anywhere in the file; {what}",
        hunk.header
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(old: &str, diff: &str) -> Result<String, DiffError> {
        let patch = parse(diff)?;
        Ok(apply(&patch, &Text::parse(old))?.text.render())
    }

    #[test]
    fn exact_hunk() {
        let out = run("a\nb\nc\n", "@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n").unwrap();
        assert_eq!(out, "a\nB\nc\n");
    }

    #[test]
    fn offset_hunk_and_wrong_counts() {
        let old = "x\ny\nz\na\nb\nc\n";
        let out = run(old, "@@ -1,9 +1,9 @@\n a\n-b\n+B\n c\n").unwrap();
        assert_eq!(out, "x\ny\nz\na\nB\nc\n");
    }

    #[test]
    fn pure_insert_and_creation() {
        assert_eq!(
            run("a\nb\n", "@@ -1,0 +2,1 @@\n+new\n").unwrap(),
            "a\nnew\nb\n"
        );
        let created = run("", "--- /dev/null\n+++ b/f\n@@ -0,0 +1,2 @@\n+one\n+two\n").unwrap();
        assert_eq!(created, "one\ntwo\n");
        assert!(
            parse("--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+x\n")
                .unwrap()
                .creates
        );
    }

    #[test]
    fn no_newline_markers() {
        let out = run(
            "a\nb",
            "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n",
        )
        .unwrap();
        assert_eq!(out, "a\nc\n");
        let out = run(
            "a\nb\n",
            "@@ -1,2 +1,2 @@\n a\n-b\n+c\n\\ No newline at end of file\n",
        )
        .unwrap();
        assert_eq!(out, "a\nc");
    }

    #[test]
    fn crlf_is_kept_and_trailing_whitespace_tolerated() {
        let out = run("a \r\nb\r\n", "@@ -1,2 +1,2 @@\n a\n-b\n+c\n").unwrap();
        assert_eq!(out, "a \r\nc\r\n");
    }

    #[test]
    fn sql_comment_is_not_a_header() {
        let out = run("-- c\nx\n", "@@ -1,2 +1,1 @@\n--- c\n x\n").unwrap();
        assert_eq!(out, "x\n");
    }

    #[test]
    fn mismatch_names_hunk_and_line() {
        let e = run("a\nb\nc\n", "@@ -1,2 +1,2 @@\n a\n-q\n+r\n").unwrap_err();
        assert!(e.0.contains("hunk 1 (`@@ -1,2 +1,2 @@`)"), "{e}");
        assert!(e.0.contains("at line 2 expected `q` but found `b`"), "{e}");
    }

    #[test]
    fn bad_input() {
        assert!(parse("hello").unwrap_err().0.contains("no hunks"));
        assert!(
            parse("@@ -x +y @@\n a\n")
                .unwrap_err()
                .0
                .contains("bad hunk header")
        );
        let two = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n--- a/y\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n";
        assert!(parse(two).unwrap_err().0.contains("more than one file"));
    }
}

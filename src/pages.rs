//! The operator binary's own pages, given back when unused.
//!
//! Code and read-only data the operator ran once (argument parsing, the
//! clients' set-up, the first list of every watch, the first pass of each
//! Redis) stay mapped into the process after it is done with them, and so
//! count in its resident set: about 10 MiB of the release build's 13 MiB
//! of resident binary pages were not touched again in an idle window.
//! [`unmap_idle_binary_pages`] drops this process's mappings of those pages
//! (`madvise(MADV_DONTNEED)`); the pages stay in the kernel's page cache, so
//! the next touch of one maps it again without reading the disk (a minor
//! fault, about a microsecond, 64 KiB mapped at a time).
//!
//! Only mappings of the executable that are not writable and hold no
//! private copy of a page, resident or swapped out (`Anonymous: 0 kB` and
//! `Swap: 0 kB` in `/proc/self/smaps`), are dropped: their contents are
//! exactly the file's, and a read-only mapping cannot gain a private copy
//! without a write. The relocated read-only data (RELRO) holds private
//! copies and is left alone, as is everything writable.

use std::ops::Range;

/// The address ranges of `smaps` (the text of `/proc/self/smaps`) that may
/// be dropped: mappings of `exe` that are readable, not writable, private,
/// and hold no anonymous (copied-on-write) page.
pub fn droppable(smaps: &str, exe: &str) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    // The mapping being read (when it is one of `exe`'s read-only ones),
    // and its `Anonymous:` and `Swap:` fields once read: a private copy of
    // a page is resident (Anonymous) or swapped out (Swap).
    let mut current: Option<(Range<usize>, Option<u64>, Option<u64>)> = None;
    let mut finish = |c: Option<(Range<usize>, Option<u64>, Option<u64>)>| {
        if let Some((range, Some(0), Some(0))) = c {
            out.push(range);
        }
    };
    for line in smaps.lines() {
        if let Some(range) = mapping_header(line, exe) {
            finish(current.take());
            current = range.map(|r| (r, None, None));
            continue;
        }
        let kib = |v: &str| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
        if let Some((_, anon, swap)) = current.as_mut() {
            if let Some(v) = line.strip_prefix("Anonymous:") {
                *anon = kib(v);
            } else if let Some(v) = line.strip_prefix("Swap:") {
                *swap = kib(v);
            }
        }
    }
    finish(current.take());
    out
}

/// `Some(range)` for a header line (`start-end perms offset dev inode
/// [path]`): the range when it maps `exe` read-only and private, `None`
/// inside when it is another mapping. `None` for a field line.
fn mapping_header(line: &str, exe: &str) -> Option<Option<Range<usize>>> {
    let mut parts = line.split_whitespace();
    let (start, end) = parts.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = parts.next()?;
    // Offset, device and inode, then the path (which may hold spaces).
    let path = parts.skip(3).collect::<Vec<_>>().join(" ");
    let p = perms.as_bytes();
    let read_only_private =
        p.len() == 4 && p[0] == b'r' && p[1] == b'-' && p[3] == b'p' && start < end;
    Some((read_only_private && path == exe).then_some(start..end))
}

/// Drops this process's mappings of the executable's unused read-only pages
/// (see the module's text). Returns the bytes of the ranges dropped.
#[cfg(target_os = "linux")]
pub fn unmap_idle_binary_pages() -> std::io::Result<usize> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let exe = exe.to_string_lossy();
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut bytes = 0;
    for range in droppable(&smaps, &exe) {
        let len = range.end - range.start;
        // SAFETY: the range is a whole mapping of the executable that is
        // read-only, private and holds no private page: dropping it leaves
        // the mapping in place, and every later read of it faults in the
        // file's unchanged bytes again. Nothing is freed that Rust owns.
        let rc = unsafe { libc_madvise(range.start, len) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        bytes += len;
    }
    Ok(bytes)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn libc_madvise(start: usize, len: usize) -> i32 {
    // SAFETY: see the caller.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) }
}

#[cfg(all(target_os = "linux", not(target_env = "gnu")))]
unsafe fn libc_madvise(_start: usize, _len: usize) -> i32 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0200000 r--p 00000000 08:01 1234 /opt/red pilot
Size:               2048 kB
Rss:                1024 kB
Anonymous:             0 kB
Swap:                  0 kB
55d0a0200000-55d0a0800000 r-xp 00200000 08:01 1234 /opt/red pilot
Size:               6144 kB
Anonymous:             0 kB
Swap:                  0 kB
55d0a0800000-55d0a0900000 r--p 00800000 08:01 1234 /opt/red pilot
Size:               1024 kB
Anonymous:           900 kB
Swap:                  0 kB
55d0a0900000-55d0a0910000 rw-p 00900000 08:01 1234 /opt/red pilot
Anonymous:            64 kB
Swap:                  0 kB
55d0a0910000-55d0a0920000 r--p 00910000 08:01 1234 /opt/red pilot
Anonymous:             0 kB
Swap:                 64 kB
55d0a0920000-55d0a0930000 r--p 00920000 08:01 1234 /opt/red pilot
Anonymous:             0 kB
7f0000000000-7f0000100000 r-xp 00000000 08:01 99 /usr/lib/libc.so.6
Anonymous:             0 kB
Swap:                  0 kB
7f0000200000-7f0000300000 r--p 00000000 00:00 0
Anonymous:             0 kB
Swap:                  0 kB
";

    #[test]
    fn only_the_executables_read_only_pages_without_private_copies_drop() {
        let got = droppable(SMAPS, "/opt/red pilot");
        assert_eq!(
            got,
            vec![
                0x55d0a0000000..0x55d0a0200000,
                0x55d0a0200000..0x55d0a0800000
            ],
            "the RELRO mapping (private copies, resident or swapped out), one \
             whose Swap is not told, the writable data, libc and an anonymous \
             mapping stay"
        );
        assert!(droppable(SMAPS, "/opt/other").is_empty());
    }

    /// The real thing on this process: its binary's resident pages go, and
    /// the code keeps running (it faults back what it runs).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn dropping_the_binary_pages_shrinks_the_resident_set_and_the_code_runs_on() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
        let exe = exe.to_string_lossy().into_owned();
        let resident = || {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
            let mut sum = 0u64;
            let mut ours = false;
            for line in smaps.lines() {
                if let Some(inside) = mapping_header(line, &exe) {
                    ours = inside.is_some();
                } else if ours && let Some(kib) = line.strip_prefix("Rss:") {
                    sum += kib
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0);
                }
            }
            sum
        };
        // Touch a spread of code first (formatting, parsing, hashing).
        let text = format!("{:?}", (1..500).map(|i| i * 7).collect::<Vec<_>>());
        let before = resident();
        assert!(before > 0, "the test binary has resident read-only pages");
        let dropped = unmap_idle_binary_pages().unwrap_or(0);
        assert!(dropped > 0, "nothing dropped");
        let after = resident();
        assert!(
            after < before,
            "resident read-only binary pages {before} KiB before, {after} KiB after"
        );
        // The code and constants fault back in.
        assert_eq!(
            text.len(),
            format!("{:?}", (1..500).map(|i| i * 7).collect::<Vec<_>>()).len()
        );
        assert_eq!(droppable(SMAPS, "/opt/red pilot").len(), 2);
    }
}

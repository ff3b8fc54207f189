//! The operator binary's own pages, given back when unused.
//!
//! Code and read-only data the operator ran once (argument parsing, the
//! clients' set-up, the first list of every watch, the first pass of each
//! Redis) stay mapped into the process after it is done with them, and so
//! count in its resident set: about 10 MiB of the release build's 13 MiB
//! of resident binary pages were not touched again in an idle window.
//! [`unmap_idle_binary_pages`] drops this process's mappings of those pages
//! (`madvise(MADV_DONTNEED)`); the next touch of one maps it again.
//!
//! Unmapping alone leaves a floor: the kernel maps the file's cached pages
//! around a faulting one in 64 KiB blocks ("fault-around"), so a function
//! touched maps its neighbours too. Two things lower it:
//! - The release link puts the functions an idle operator runs first and
//!   together (`build.rs`, `hack/hot-symbols.txt`): the blocks mapped
//!   again are mostly code that runs.
//! - With `evict`, the pass also asks the kernel to read the binary page
//!   by page from then on (`MADV_RANDOM`: no read-ahead around a fault)
//!   and drops the file's pages no process maps from the page cache
//!   (`POSIX_FADV_DONTNEED`): what is cached after that is what was touched
//!   since, and fault-around has nothing more to map. The read-only data
//!   gains most from it: on this machine's kernel (6.18) a fault in an
//!   executable mapping still reads a whole read-ahead window. The price is
//!   a disk read (a major fault, about 45 microseconds each on a virtio
//!   disk) the first time a page is needed again; pages another process
//!   maps (a second operator from the same file) stay cached.
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

/// The value of an `smaps` size field (`"   900 kB"`), in KiB.
fn kib(value: &str) -> Option<u64> {
    value.trim().trim_end_matches("kB").trim().parse().ok()
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
/// and, with `evict`, the file's unmapped pages from the page cache (see the
/// module's text). Returns the bytes of the ranges dropped.
#[cfg(target_os = "linux")]
pub fn unmap_idle_binary_pages(evict: bool) -> std::io::Result<usize> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut bytes = 0;
    for range in droppable(&smaps, &exe.to_string_lossy()) {
        let len = range.end - range.start;
        if evict {
            // SAFETY: advice only: how the kernel reads the file behind a
            // whole read-only mapping of it on a fault.
            if unsafe { advise(range.start, len, Advice::PageByPage) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        // SAFETY: the range is a whole mapping of the executable that is
        // read-only, private and holds no private page: dropping it leaves
        // the mapping in place, and every later read of it faults in the
        // file's unchanged bytes again. Nothing is freed that Rust owns.
        if unsafe { advise(range.start, len, Advice::Unmap) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        bytes += len;
    }
    if evict {
        evict_from_page_cache(&std::fs::File::open(&exe)?)?;
    }
    Ok(bytes)
}

/// What [`advise`] tells the kernel about a range.
#[cfg(target_os = "linux")]
enum Advice {
    /// Read the file behind it one page per fault (`MADV_RANDOM`).
    PageByPage,
    /// Drop this process's mapping of its pages (`MADV_DONTNEED`).
    Unmap,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe fn advise(start: usize, len: usize, advice: Advice) -> i32 {
    let advice = match advice {
        Advice::PageByPage => libc::MADV_RANDOM,
        Advice::Unmap => libc::MADV_DONTNEED,
    };
    // SAFETY: see the callers.
    unsafe { libc::madvise(start as *mut libc::c_void, len, advice) }
}

#[cfg(all(target_os = "linux", not(target_env = "gnu")))]
unsafe fn advise(_start: usize, _len: usize, _advice: Advice) -> i32 {
    0
}

/// Drops `file`'s clean pages that no process maps from the page cache.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn evict_from_page_cache(file: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on an open file descriptor this function borrows; the
    // kernel drops only pages it can read back from the file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    // posix_fadvise returns the error number instead of setting errno.
    match rc {
        0 => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}

#[cfg(all(target_os = "linux", not(target_env = "gnu")))]
fn evict_from_page_cache(_file: &std::fs::File) -> std::io::Result<()> {
    Ok(())
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

    /// The resident size of this process's read-only binary mappings, KiB.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn resident_binary_kib() -> u64 {
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
        let exe = exe.to_string_lossy().into_owned();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        let mut sum = 0u64;
        let mut ours = false;
        for line in smaps.lines() {
            if let Some(inside) = mapping_header(line, &exe) {
                ours = inside.is_some();
            } else if ours && let Some(v) = line.strip_prefix("Rss:") {
                sum += kib(v).unwrap_or(0);
            }
        }
        sum
    }

    /// Pages of the executable's read-only data (its droppable mappings
    /// that are not executable) that are in the page cache.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn cached_data_pages() -> usize {
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
        let exe = exe.to_string_lossy().into_owned();
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
        let droppable = droppable(&smaps, &exe);
        let data: Vec<Range<usize>> = smaps
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("r--p"))
            .filter_map(|l| mapping_header(l, &exe).flatten())
            .filter(|r| droppable.contains(r))
            .collect();
        let mut cached = 0;
        for range in data {
            let mut flags = vec![0u8; (range.end - range.start).div_ceil(4096)];
            // SAFETY: a whole mapping of this process; the kernel writes
            // one byte per page into `flags`, which has one per page.
            let rc = unsafe {
                libc::mincore(
                    range.start as *mut libc::c_void,
                    range.end - range.start,
                    flags.as_mut_ptr(),
                )
            };
            assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
            cached += flags.iter().filter(|f| *f & 1 == 1).count();
        }
        cached
    }

    /// Code spread over the binary: formatting, parsing, hashing, sorting.
    fn spread_work() -> usize {
        let text = format!("{:?}", (1..500).map(|i| i * 7).collect::<Vec<_>>());
        let mut words: Vec<String> = text.split(", ").map(|w| w.to_string()).collect();
        words.sort();
        let set: std::collections::HashSet<&String> = words.iter().collect();
        let back: Vec<u64> = words
            .iter()
            .filter_map(|w| w.trim_matches(['[', ']']).parse().ok())
            .collect();
        text.len() + set.len() + back.len() + droppable(SMAPS, "/opt/red pilot").len()
    }

    /// The real thing on this process: its binary's resident pages go, and
    /// the code keeps running (it faults back what it runs).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn dropping_the_binary_pages_shrinks_the_resident_set_and_the_code_runs_on() {
        let expected = spread_work();
        let before = resident_binary_kib();
        assert!(before > 0, "the test binary has resident read-only pages");
        let dropped = unmap_idle_binary_pages(false).unwrap_or(0);
        assert!(dropped > 0, "nothing dropped");
        let after = resident_binary_kib();
        assert!(
            after < before,
            "resident read-only binary pages {before} KiB before, {after} KiB after"
        );
        // The code and constants fault back in.
        assert_eq!(spread_work(), expected);

        // Evicted: the read-only data's pages leave the page cache, and
        // what is read again comes back a page at a time. (The page cache
        // keeps a page not yet written back: a freshly linked test binary
        // is written back first.)
        let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
        std::fs::File::open(&exe)
            .and_then(|f| f.sync_data())
            .unwrap_or_else(|e| panic!("write back {}: {e}", exe.display()));
        let cached = cached_data_pages();
        assert!(cached > 0, "none of the read-only data is cached");
        unmap_idle_binary_pages(true).unwrap_or_else(|e| panic!("unmap and evict: {e}"));
        assert_eq!(spread_work(), expected);
        let left = cached_data_pages();
        assert!(
            left * 4 < cached,
            "{left} of the read-only data's {cached} cached pages still cached after the eviction"
        );
    }
}

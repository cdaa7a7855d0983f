//! The idle sidecar's resident memory (BENCHMARKS.md, footprint). Start-up
//! (parsing the command line, connecting, creating the table, the first
//! election round) runs code spread over most of the executable once; the
//! kernel maps each page it touches, and its neighbours, and keeps them
//! mapped. An idle sidecar then runs a small share of that code. Once the
//! elector has heard from the store, the executable's read-only pages are
//! handed back to the kernel (`MADV_PAGEOUT`, Linux 5.4+), which reclaims
//! the ones no other process maps (pages shared with other processes that
//! run the same file stay: they are not this process's alone). What the
//! sidecar runs afterwards comes back from the file as it is used.

use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use leasehold_core::lease::{Change, LeaderState};

/// Waits until the elector has heard from the store (start-up is over),
/// then `settle` more, then pages out the executable's read-only pages.
pub(crate) async fn release_start_up_pages(mut state: watch::Receiver<LeaderState>, settle: Duration) {
    let heard = state
        .wait_for(|s| matches!(s.change, Change::Observed | Change::Acquired | Change::Renewed))
        .await
        .is_ok();
    if !heard {
        return;
    }
    tokio::time::sleep(settle).await;
    match page_out_executable() {
        Ok(bytes) => debug!(bytes, "start-up pages of the executable handed back to the kernel"),
        Err(e) => debug!(error = %e, "could not hand start-up pages back to the kernel"),
    }
}

/// The executable's clean, read-only mappings (code, and read-only data at
/// the file's start) as (start, length) from `maps` (the format of
/// `/proc/self/maps`). Writable mappings, and read-only ones further into
/// the file (relocated data, private copies), are left alone.
fn read_only_mappings(maps: &str, exe: &str) -> Vec<(usize, usize)> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (range, perms, offset) = (fields.next()?, fields.next()?, fields.next()?);
            let path = fields.nth(2)?;
            let (start, end) = range.split_once('-')?;
            let (start, end) = (
                usize::from_str_radix(start, 16).ok()?,
                usize::from_str_radix(end, 16).ok()?,
            );
            let code = perms.starts_with("r-x");
            let leading_read_only = perms.starts_with("r--") && u64::from_str_radix(offset, 16).ok()? == 0;
            (path == exe && (code || leading_read_only) && end > start).then_some((start, end - start))
        })
        .collect()
}

/// Advises the kernel to reclaim the executable's read-only pages; returns
/// how many bytes were advised.
#[cfg(target_os = "linux")]
fn page_out_executable() -> std::io::Result<usize> {
    let exe = std::fs::read_link("/proc/self/exe")?;
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut advised = 0;
    for (start, len) in read_only_mappings(&maps, &exe.to_string_lossy()) {
        // SAFETY: a whole mapping of this process, read from /proc/self/maps.
        // MADV_PAGEOUT changes no contents: a reclaimed clean page is read
        // back from the file on its next access.
        unsafe { rustix::mm::madvise(start as *mut std::ffi::c_void, len, rustix::mm::Advice::LinuxPageOut) }?;
        advised += len;
    }
    Ok(advised)
}

#[cfg(not(target_os = "linux"))]
fn page_out_executable() -> std::io::Result<usize> {
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_executables_code_and_leading_read_only_data_are_paged_out() {
        let exe = "/usr/bin/leasehold";
        let maps = "\
55f03c22b000-55f03c678000 r--p 00000000 fe:00 10010659 /usr/bin/leasehold
55f03c678000-55f03d512000 r-xp 0044d000 fe:00 10010659 /usr/bin/leasehold
55f03d512000-55f03d590000 r--p 012e6000 fe:00 10010659 /usr/bin/leasehold
55f03d590000-55f03d597000 rw-p 01364000 fe:00 10010659 /usr/bin/leasehold
55f03e000000-55f03e100000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000100000 r-xp 00000000 fe:00 42 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000201000 r--p 00000000 00:00 0
";
        assert_eq!(
            read_only_mappings(maps, exe),
            [(0x55f03c22b000, 0x44d000), (0x55f03c678000, 0xe9a000)]
        );
    }

    /// On this very process: the executable's mappings are found and the
    /// kernel accepts the advice (what it reclaims is measured by the
    /// footprint benchmark, not here: other test processes share the pages).
    #[cfg(target_os = "linux")]
    #[test]
    fn the_running_executable_is_advised() {
        let advised = page_out_executable().expect("madvise(MADV_PAGEOUT) on our own code");
        assert!(advised > 0, "found no read-only mapping of /proc/self/exe");
    }
}

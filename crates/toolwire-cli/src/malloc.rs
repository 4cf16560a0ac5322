//! glibc's malloc, set for the bursts of a path read.
//!
//! Reading a long conversation's path allocates a few megabytes of small
//! objects and frees them all when the request is built. With glibc's
//! defaults each such free gives the top of the heap back to the system
//! (the trim threshold follows the largest freed mapping, a few megabytes)
//! and the next read faults every page in again: about 1,000 page faults
//! per 10,000-message read, which made a tool loop's whole read take
//! 7.7 ms instead of 4.8 (`cargo bench -p toolwire-store --bench path_to`
//! with and without the same settings as `GLIBC_TUNABLES`, see docs/performance.md).
//! Fixed thresholds keep up to [`TRIM_THRESHOLD`] of free heap for reuse;
//! `toolwire-bench serve-load` showed the same memory either way.

/// Free memory at the top of a heap kept for reuse rather than given back.
pub const TRIM_THRESHOLD: i32 = 16 << 20;
/// Allocations from this size up get their own mapping (a path's message
/// list of 40,000 messages and more, say).
pub const MMAP_THRESHOLD: i32 = 8 << 20;

/// Sets the thresholds; call it first thing, before any thread starts.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() {
    // SAFETY: `mallopt` only sets malloc's parameters (under malloc's own
    // lock); it takes plain integers and touches no memory of ours.
    let set = unsafe {
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            & libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    };
    if set != 1 {
        // Nothing is wrong but speed: say so where it can be seen.
        eprintln!("note: glibc's malloc thresholds could not be set; path reads may be slower");
    }
}

/// Other C libraries have other allocators: nothing to set.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

//! The `toolwall` binary: parses the command line and hands over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    // Buffers of 1 MiB and more (a held stream, a request body) are mapped on their own and
    // unmapped when freed, and grow without copying. glibc's default raises this threshold
    // as large buffers are freed, after which they come from arenas that keep what was freed:
    // the daemon's resident memory then stays at twice its peak of held bytes instead of
    // following `proxy.memory_budget_bytes` (tests/tests/llm_bounds.rs measures it).
    // Setting it also fixes the trim threshold, which glibc would otherwise keep at twice the
    // mmap threshold; both are set so the relay's own buffers stay in the arenas: hyper's read
    // buffers (up to 408 KiB) are allocated anew for each read while the last one's bytes are
    // still in flight, and mapping each of them, or giving the heap's top back after each,
    // cost the relay two thirds of its throughput (`cargo xtask bench llm-throughput`, the
    // relay next to nginx).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1024 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 8 * 1024 * 1024);
    }
    let cli = toolwall::Cli::parse();
    toolwall::main(cli)
}

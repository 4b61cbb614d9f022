//! The `toolwall` binary: parses the command line and hands over to the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    // Buffers of 256 KiB and more (a held event, a request body) are mapped on their own and
    // unmapped when freed, and grow without copying. glibc's default raises this threshold
    // as large buffers are freed, after which they come from arenas that keep what was freed:
    // the daemon's resident memory then stays at twice its peak of held bytes instead of
    // following `proxy.memory_budget_bytes` (tests/tests/llm_bounds.rs measures it).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024);
    }
    let cli = toolwall::Cli::parse();
    toolwall::main(cli)
}

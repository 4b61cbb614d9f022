//! JSON-RPC framing and tool filtering on arbitrary bytes in arbitrary pieces, both
//! directions. The oracle (`toolwall::fuzzing::mcp_filter`): no denied tool in any output, nothing
//! but denied calls and unreadable messages changed, every output and reply valid JSON.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    toolwall::fuzzing::mcp_filter(data);
});

//! The LLM SSE interceptors (Anthropic, Chat Completions, Responses) on arbitrary upstream
//! bytes in arbitrary pieces. The oracle (`toolwall::fuzzing::llm_sse`): no blocked tool's call in
//! the output, a well-formed input gives a well-formed output, no panic.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    toolwall::fuzzing::llm_sse(data);
});

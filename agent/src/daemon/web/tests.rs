//! The page's escaper against the CLI's: the same characters, written the same way.

use super::*;

/// The page's script from the set of hidden characters up to the page's own state: the set
/// and the functions that escape it, as served.
fn escaper() -> &'static str {
    let start = PAGE
        .find("const HIDDEN = ")
        .expect("the page declares HIDDEN");
    let end = PAGE[start..]
        .find("const rows = ")
        .expect("the escaper comes before the page's state");
    &PAGE[start..start + end]
}

/// Inclusive ranges of the code points `escapes` says yes to.
fn ranges(escapes: impl Fn(char) -> bool) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for c in (0..=0x10FFFF)
        .filter_map(char::from_u32)
        .filter(|&c| escapes(c))
    {
        let c = u32::from(c);
        match out.last_mut() {
            Some(last) if last.1 + 1 == c => last.1 = c,
            _ => out.push((c, c)),
        }
    }
    out
}

#[test]
fn the_page_carries_the_one_set_of_hidden_characters() {
    assert_eq!(TEMPLATE.matches(HIDDEN_MARK).count(), 1);
    assert!(!PAGE.contains(HIDDEN_MARK));
    let declared = escaper()
        .strip_prefix("const HIDDEN = ")
        .and_then(|rest| rest.split_once(";\n"))
        .map(|(json, _)| json)
        .expect("HIDDEN is one line");
    let declared: Vec<(u32, u32)> = serde_json::from_str(declared).expect("HIDDEN is JSON");
    assert_eq!(declared, crate::hidden::RANGES);
}

/// Runs the served page's `shown` under node over every Unicode scalar value: it escapes
/// exactly the characters the CLI's views escape (`hidden::escaped`, which `toolwall mcp calls`
/// and `toolwall approvals` write their cells with), as `\u{..}` the same way.
#[test]
fn the_pages_escaper_escapes_exactly_what_the_cli_escapes() {
    let script = format!(
        r#"{escaper}
const escaped = [];
for (let cp = 0; cp <= 0x10FFFF; cp++) {{
  if (cp >= 0xD800 && cp <= 0xDFFF) continue;
  const text = String.fromCodePoint(cp);
  const out = shown(text);
  if (out === text) continue;
  if (out !== `\\u{{${{cp.toString(16)}}}}`) throw new Error(`U+${{cp.toString(16)}} written as ${{out}}`);
  const last = escaped[escaped.length - 1];
  if (last && last[1] + 1 === cp) last[1] = cp; else escaped.push([cp, cp]);
}}
console.log(JSON.stringify({{ escaped, sample: shown("read\u2060_file \u202Eabc") }}));
"#,
        escaper = escaper()
    );
    let out = match std::process::Command::new("node")
        .args(["-e", &script])
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!(
            "node runs the web view's script here ({e}): install Node.js (`cargo xtask peers` needs it too)"
        ),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let page: Vec<(u32, u32)> = serde_json::from_value(said["escaped"].clone()).expect("ranges");
    let cli = ranges(|c| {
        let text = c.to_string();
        let shown = crate::hidden::escaped(&text);
        if shown == text {
            return false;
        }
        assert_eq!(shown, c.escape_unicode().to_string());
        true
    });
    assert_eq!(page, cli);
    assert_eq!(
        said["sample"],
        crate::hidden::escaped("read\u{2060}_file \u{202E}abc").as_ref()
    );
}

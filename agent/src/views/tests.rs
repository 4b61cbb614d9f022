//! Reading `--since`.

use super::*;

#[test]
fn since_accepts_times_and_ages_and_explains_mistakes() {
    let t = parse_since("2026-11-22T10:00:00Z").unwrap();
    assert_eq!(t, 1_795_341_600 * 1_000_000_000);
    let now = chrono::Utc::now().timestamp_nanos_opt().unwrap();
    let ten_min = parse_since("10m").unwrap();
    assert!((now - ten_min - 600_000_000_000).abs() < 5_000_000_000);
    assert!(
        parse_since("10 minutes")
            .unwrap_err()
            .to_string()
            .contains("unit is s, m, h or d")
    );
    assert!(parse_since("yesterday").is_err());
}

//! Strategy names and the `[compaction]` settings section: parsing, defaults, checks.

use super::*;

#[test]
fn strategy_names_round_trip() {
    for s in Strategy::ALL {
        assert_eq!(s.to_string().parse::<Strategy>().unwrap(), s);
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, format!("\"{s}\""));
        assert_eq!(serde_json::from_str::<Strategy>(&json).unwrap(), s);
    }
    assert_eq!(Strategy::default(), Strategy::Recency);
    assert_eq!(
        "llm_replace".parse::<Strategy>().unwrap(),
        Strategy::LlmReplace
    );
    assert!("summary".parse::<Strategy>().is_err());
}

#[test]
fn settings_have_documented_defaults_and_reject_unknown_keys() {
    let s: Settings = toml::from_str("").unwrap();
    assert_eq!(s, Settings::default());
    assert_eq!(s.protect_head, 3);
    assert_eq!(s.tail_budget_ratio, 0.2);
    assert_eq!(s.summary_role, SummaryRole::User);
    let s: Settings = toml::from_str("summary_role = \"system\"\nprotect_head = 1").unwrap();
    assert_eq!(s.summary_role, SummaryRole::System);
    assert_eq!(s.protect_head, 1);
    assert!(toml::from_str::<Settings>("protect_heads = 1").is_err());
    let round: Settings = toml::from_str(&toml::to_string(&Settings::default()).unwrap()).unwrap();
    assert_eq!(round, Settings::default());
    assert!(Settings::default().check().is_ok());
    let bad = Settings {
        tail_budget_ratio: 1.5,
        ..Settings::default()
    };
    assert!(bad.check().unwrap_err().contains("tail_budget_ratio"));
}

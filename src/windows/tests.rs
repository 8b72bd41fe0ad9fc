use super::*;
use crate::config::StoreConfig;

const UP: &str = "http://127.0.0.1:8080/v1";

fn tenant(n: u32) -> Fingerprint {
    let mut bytes = [0u8; 32];
    bytes[..4].copy_from_slice(&n.to_le_bytes());
    Fingerprint::from_hex(&hex::encode(bytes)).unwrap()
}

fn windows() -> (Store, Windows) {
    let store = Store::from_config(&StoreConfig::default()).unwrap();
    (store.clone(), Windows::new(store))
}

#[tokio::test]
async fn a_tenants_overflow_teaches_that_tenant_only_until_a_second_states_it() {
    let (_, w) = windows();
    let (a, b, c) = (tenant(1), tenant(2), tenant(3));
    assert_eq!(
        w.overflowed((UP, "Local-Model", a), Some(8192), 9000, 128_000),
        Some(8192)
    );
    assert_eq!(w.get(UP, "local-model", Some(a)), Some(8192), "by case");
    assert_eq!(
        w.get(UP, "local-model", Some(b)),
        None,
        "not another tenant's"
    );
    assert_eq!(w.get(UP, "local-model", None), None);
    assert_eq!(w.get("http://other/v1", "local-model", Some(a)), None);
    // A second tenant stating another number confirms nothing.
    w.overflowed((UP, "local-model", b), Some(16_384), 20_000, 128_000);
    assert_eq!(w.get(UP, "local-model", Some(c)), None);
    // A third stating the first's number confirms it for everyone.
    w.overflowed((UP, "local-model", c), Some(8192), 9000, 128_000);
    assert_eq!(w.get(UP, "local-model", Some(tenant(9))), Some(8192));
    assert_eq!(
        w.get(UP, "local-model", Some(b)),
        Some(16_384),
        "a tenant's own still wins"
    );
    let confirmed: Vec<_> = w
        .list()
        .into_iter()
        .filter(|l| l.tenant.is_none())
        .collect();
    assert_eq!(confirmed.len(), 1);
}

#[tokio::test]
async fn no_learned_window_is_under_the_floor_and_shrinking_never_confirms() {
    let (_, w) = windows();
    let (a, b) = (tenant(1), tenant(2));
    // No number stated: below what was sent, and below what is known, never under FLOOR.
    assert_eq!(
        w.overflowed((UP, "quiet", a), None, 10_000, 128_000),
        Some(9_000)
    );
    assert_eq!(
        w.overflowed((UP, "quiet", a), None, 10_000, 6_000),
        Some(6_000)
    );
    assert_eq!(w.overflowed((UP, "quiet", a), None, 6, 6), Some(FLOOR));
    assert_eq!(
        w.overflowed((UP, "tiny", a), Some(300), 400, 128_000),
        Some(FLOOR)
    );
    w.overflowed((UP, "quiet", b), None, 6, 6);
    assert_eq!(
        w.get(UP, "quiet", None),
        None,
        "shrunk windows stay the tenant's"
    );
    w.asked(UP, "small-served", 512);
    assert_eq!(w.get(UP, "small-served", None), Some(FLOOR));
}

#[tokio::test]
async fn model_names_too_long_are_never_kept() {
    let (_, w) = windows();
    let long = "m".repeat(MAX_MODEL_BYTES + 1);
    assert_eq!(
        w.overflowed((UP, &long, tenant(1)), Some(8192), 9000, 128_000),
        None
    );
    w.asked(UP, &long, 8192);
    assert!(w.list().is_empty());
    assert_eq!(w.get(UP, &long, Some(tenant(1))), None);
}

#[tokio::test]
async fn a_flood_of_junk_names_evicts_the_least_used_never_a_model_in_use() {
    let (_, w) = windows();
    w.asked(UP, "real-model", 32_768);
    for i in 0..(MAX_CONFIRMED * 3) {
        w.asked(UP, &format!("junk-{i}"), 4096);
        // The real model serves requests all along.
        assert_eq!(
            w.get(UP, "real-model", None),
            Some(32_768),
            "after {i} junk names"
        );
    }
    assert_eq!(w.list().len(), MAX_CONFIRMED);
    // One tenant's own windows are bounded, and so are all tenants' together.
    for i in 0..100 {
        w.overflowed(
            (UP, &format!("junk-{i}"), tenant(1)),
            Some(4096),
            5000,
            128_000,
        );
    }
    let of_one = w.list().iter().filter(|l| l.tenant.is_some()).count();
    assert_eq!(of_one, MAX_PER_TENANT);
    for t in 0..(MAX_TENANT_WINDOWS as u32 + 50) {
        w.overflowed(
            (UP, "m", tenant(100 + t)),
            Some(4096 + u64::from(t)),
            5000,
            128_000,
        );
    }
    let tenants = w.list().iter().filter(|l| l.tenant.is_some()).count();
    assert_eq!(tenants, MAX_TENANT_WINDOWS);
}

#[tokio::test]
async fn windows_are_shared_through_the_store_and_forgotten_everywhere() {
    let (store, one) = windows();
    one.asked(UP, "shared-model", 8192);
    one.overflowed((UP, "own", tenant(1)), Some(4096), 5000, 128_000);
    let two = Windows::new(store.clone());
    let mut shared = false;
    for _ in 0..50 {
        two.refresh().await;
        if two.get(UP, "shared-model", None) == Some(8192)
            && two.get(UP, "own", Some(tenant(1))) == Some(4096)
        {
            shared = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(shared);
    assert_eq!(two.list()[0].learned.source, Source::Overflow);
    // Forgotten on one replica: gone from the store, and from the other at its refresh.
    assert_eq!(one.forget(Some("Shared-Model")).await, 1);
    assert_eq!(one.get(UP, "shared-model", None), None);
    two.refresh().await;
    assert_eq!(two.get(UP, "shared-model", None), None);
    assert_eq!(
        two.get(UP, "own", Some(tenant(1))),
        Some(4096),
        "the rest stays"
    );
    assert_eq!(one.forget(None).await, 1);
    two.refresh().await;
    assert!(two.list().is_empty());
}

#[tokio::test]
async fn what_expired_or_cannot_be_read_is_dropped_from_the_store() {
    let (store, w) = windows();
    let key = Key::of(None, UP, "old").unwrap();
    let old = Learned {
        window: 8192,
        source: Source::Asked,
        at_ms: now_ms() - TTL.as_millis() as u64 - 1,
    };
    let value = serde_json::to_string(&old).unwrap();
    store
        .write_windows(Some((&key.field(), &value)), &[], TTL)
        .await
        .unwrap();
    // What an earlier version kept (no tenant, a shrunk 6): not read, removed.
    store
        .write_windows(
            Some((
                &format!("{UP} legacy"),
                r#"{"window":6,"source":"shrunk","at_ms":1}"#,
            )),
            &[],
            TTL,
        )
        .await
        .unwrap();
    w.refresh().await;
    assert!(w.list().is_empty());
    assert!(store.windows().await.unwrap().is_empty());
}

#[test]
fn a_stored_field_names_its_tenant_upstream_and_model() {
    for key in [
        Key::of(None, UP, "Qwen/Qwen3 8B").unwrap(),
        Key::of(Some(tenant(7)), UP, "m").unwrap(),
    ] {
        assert_eq!(Key::from_field(&key.field()), Some(key));
    }
    assert_eq!(Key::from_field("garbage"), None);
    assert_eq!(
        Key::from_field(&format!("*\u{1f}{UP}\u{1f}{}", "m".repeat(300))),
        None
    );
}

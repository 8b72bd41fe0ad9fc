//! The validator: every kind of broken plan it must reject.

use super::*;

/// `test`, given an agentic conversation's messages, a good recency plan of it, and
/// what `validate` says of that plan once a change has broken it.
fn with_broken_plans(
    test: impl FnOnce(&[Item<'_>], &Plan, &dyn Fn(&dyn Fn(&mut Plan)) -> Violation),
) {
    let msgs = agentic(6, 3000);
    let body = body(&msgs);
    let messages = parse(&body);
    let e = Estimator::approx();
    let good = run(
        Strategy::Recency,
        &input(&messages, e.messages(&messages) / 2, &e),
        &Settings::default(),
        never,
    )
    .unwrap();
    validate(&messages, &good).unwrap();
    assert!(good.origin.iter().any(|o| matches!(o, Origin::Digest(_))));
    let broken = |f: &dyn Fn(&mut Plan)| {
        let mut p = good.clone();
        f(&mut p);
        validate(&messages, &p).unwrap_err()
    };
    test(&messages, &good, &broken);
}

#[test]
fn the_validator_rejects_plans_that_cut_in_the_wrong_place() {
    with_broken_plans(|messages, _, broken| {
        assert!(matches!(
            broken(&|p| p.head = 0),
            Violation::SystemMessages { .. }
        ));
        assert!(matches!(
            broken(&|p| p.head = 3),
            Violation::Cut { index: 3 }
        ));
        assert!(matches!(
            broken(&|p| p.through = messages.len() - 1),
            Violation::FinalTurn { .. }
        ));
        assert!(matches!(
            broken(&|p| {
                p.head = 1;
                p.through = 2;
            }),
            Violation::Cut { index: 3 }
        ));
        assert!(matches!(
            broken(&|p| p.through = 0),
            Violation::Range { .. }
        ));
        assert!(matches!(
            broken(&|p| {
                p.origin.pop();
            }),
            Violation::Origins { .. }
        ));
    });
}

#[test]
fn the_validator_rejects_broken_replacements() {
    with_broken_plans(|messages, good, broken| {
        // An authored message without the frame.
        assert!(matches!(
            broken(&|p| p.replacement[0] =
                RawValue::from_string(r#"{"role":"user","content":"hi"}"#.to_owned()).unwrap()),
            Violation::Unframed { position: 0 }
        ));
        // A "verbatim" copy that is not.
        let verbatim = good
            .origin
            .iter()
            .position(|o| matches!(o, Origin::Verbatim(_)))
            .unwrap();
        assert!(matches!(
            broken(&|p| p.replacement[verbatim] =
                RawValue::from_string(r#"{"role":"assistant","content":"x"}"#.to_owned()).unwrap()),
            Violation::NotVerbatim { .. }
        ));
        // A digest that drops an unknown field.
        let digest = good
            .origin
            .iter()
            .position(|o| matches!(o, Origin::Digest(_)))
            .unwrap();
        assert!(matches!(
            broken(&|p| {
                let mut v: Value = serde_json::from_str(p.replacement[digest].get()).unwrap();
                v.as_object_mut().unwrap().remove("x_meta");
                p.replacement[digest] = RawValue::from_string(v.to_string()).unwrap();
            }),
            Violation::Digest { .. }
        ));
        // A tool result copied without its call.
        assert!(matches!(
            broken(&|p| {
                let call = p
                    .origin
                    .iter()
                    .position(
                        |o| matches!(o, Origin::Verbatim(i) if !messages[*i].calls.is_empty()),
                    )
                    .unwrap();
                p.replacement.remove(call);
                p.origin.remove(call);
            }),
            Violation::ToolPair { .. }
        ));
        // Unparseable replacement.
        assert!(matches!(
            broken(&|p| p.replacement[0] = RawValue::from_string("[1]".to_owned()).unwrap()),
            Violation::Unreadable { .. }
        ));
    });
}

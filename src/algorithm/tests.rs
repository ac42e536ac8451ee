use proptest::prelude::*;

use super::*;

/// The shared conformance vectors against the bare models.
mod vectors;

/// One of the six algorithms (both token-bucket refills) with small numbers.
fn algorithm(kind: u8, quota: u64, period: u64) -> Algorithm {
    crate::rule::sample(kind, quota, period).algorithm().clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// `admit` (with its one-pass shortcuts) says and records exactly what `evaluate`,
    /// then `apply`, `expires_at` and `mark` do, on states left by admissions now and
    /// reserved ahead.
    #[test]
    fn admit_is_evaluate_then_apply(
        kind in 0u8..7,
        quota in 1u64..6,
        period in 1u64..3_000,
        steps in proptest::collection::vec(
            (0u64..2_000, 0u64..8, prop_oneof![3 => Just(0u64), 1 => 0u64..3_000]),
            1..60,
        ),
    ) {
        let algorithm = algorithm(kind, quota, period);
        let mut state = State::default();
        let mut now = 1_000_000;
        for (advance, cost, ahead) in steps {
            now += advance;
            let at = now + ahead;
            let mut admitted = state.clone();
            let got = algorithm.admit(&mut admitted, at, cost);
            let eval = algorithm.evaluate(&state, at, cost);
            match eval.verdict {
                Verdict::Admit { .. } => {
                    if cost > 0 {
                        algorithm.apply(&mut state, at, cost);
                    }
                    let want = Admitted {
                        eval,
                        expires_at: algorithm.expires_at(&state),
                        mark: algorithm.mark(&state, at),
                    };
                    prop_assert_eq!(got, Ok(want));
                    prop_assert_eq!(&admitted, &state);
                }
                Verdict::Reject { .. } => {
                    prop_assert_eq!(got, Err(eval));
                    prop_assert_eq!(&admitted, &state);
                }
            }
        }
    }
}

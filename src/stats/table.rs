//! The `metrics!` macro, which turns the metric table of [`super`] into [`super::Stats`],
//! its registration and its [`super::Snapshot`].

/// The metric table: every metric declared once, in the order of `/metrics` and of the
/// `/admin/stats` JSON. It generates [`Stats`] (one field per metric), its `Default`,
/// [`Stats::register`], [`Snapshot`], [`Stats::snapshot`] and the plain counters' methods.
///
/// A plain counter is one entry — the snapshot field's doc, then
/// `field: "metric_name", "Help text" => fn record;` — and becomes a `Counter` field,
/// the metric `abridge_<metric_name>`, the snapshot field `field` with its value and, when
/// named, the method `record(&self)` that counts one (without it, a hand-written method
/// below adds to it). A hand-built metric (labels, a gauge, a histogram) gives its type
/// and constructor, then the snapshot fields it feeds, each read by a closure over
/// `&Stats`: `field: Type = constructor, "metric_name", "Help text" => { name: u64 = |s| .. };`.
macro_rules! metrics {
    // A plain counter, rewritten into the hand-built form.
    (@munch [$($done:tt)*]
        $(#[$doc:meta])* $field:ident: $metric:literal, $help:literal $(=> fn $inc:ident)?;
        $($rest:tt)*
    ) => {
        metrics!(@munch [$($done)*
            [$field: Counter = Counter::default(), $metric, $help, [$($inc)?] => {
                $(#[$doc])* $field: u64 = |s: &Stats| s.$field.get()
            }]
        ] $($rest)*);
    };
    (@munch [$($done:tt)*]
        $field:ident: $ty:ty = $init:expr, $metric:literal, $help:literal => { $($snap:tt)* };
        $($rest:tt)*
    ) => {
        metrics!(@munch [$($done)*
            [$field: $ty = $init, $metric, $help, [] => { $($snap)* }]
        ] $($rest)*);
    };
    (@munch [$(
        [$field:ident: $ty:ty = $init:expr, $metric:literal, $help:literal, [$($inc:ident)?] => {
            $($(#[$doc:meta])* $snap:ident: $sty:ty = $read:expr),* $(,)?
        }]
    )*]) => {
        /// The metrics. Cloning shares them (every handle is an `Arc` inside).
        #[derive(Debug, Clone)]
        pub struct Stats {
            $($field: $ty,)*
        }

        impl Default for Stats {
            fn default() -> Self {
                Self {
                    $($field: $init,)*
                }
            }
        }

        /// A point-in-time copy of the counters, for `/admin/stats` and the tests.
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
        pub struct Snapshot {
            $($($(#[$doc])* pub $snap: $sty,)*)*
        }

        impl Stats {
            /// Registers every metric under the `abridge` prefix.
            pub fn register(&self, registry: &mut Registry) {
                let r = registry.sub_registry_with_prefix("abridge");
                $(r.register($metric, $help, self.$field.clone());)*
            }

            /// The figures as numbers. Reads only series that exist (`get`, not
            /// `get_or_create`), so asking for a snapshot adds no zero series to `/metrics`.
            pub fn snapshot(&self) -> Snapshot {
                Snapshot {
                    $($($snap: read(self, $read),)*)*
                }
            }

            $($(
                pub fn $inc(&self) {
                    self.$field.inc();
                }
            )?)*
        }
    };
    ($($entries:tt)*) => {
        metrics!(@munch [] $($entries)*);
    };
}

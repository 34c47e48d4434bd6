#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod cases;
pub mod faults;
mod harness;
pub mod herd;
pub mod repeat;
pub mod scratch;
pub mod support;
pub mod tls;

pub use harness::{BackendFactory, Case, Flavor, Harness, Needs};

/// Expands to one `#[tokio::test]` per case of the suite, each running
/// against the [`Harness`] that `$harness` (an expression of type
/// `Option<Harness>`, evaluated in each test) gives. `None` skips loudly.
///
/// Every case is there: the mutex cases, the kill cases, the read-write
/// lock cases (module `rwlock`) and the semaphore cases (module
/// `semaphore`), and the mutex cases again on the write side of a
/// read-write lock and on a semaphore of one permit. A case that needs a
/// capability the backend does not declare (see [`Needs`]) skips loudly
/// at run time, so one macro serves every backend.
///
/// ```ignore
/// quorumlock_conformance::suite!(quorumlock_conformance::Harness::from_env(
///     "QUORUMLOCK_TEST_ETCD_URL",
///     |url| async move { Ok(std::sync::Arc::new(MyBackend::connect(&url).await?) as _) },
/// ));
/// ```
#[macro_export]
macro_rules! suite {
    ($harness:expr) => {
        $crate::__quorumlock_conformance_expand!($harness; [];
            exclusion_under_contention,
            tokens_strictly_increase,
            try_acquire_when_held,
            timeouts_of_any_length,
            holder_between_repeated_cycles,
            timeout_bounds_and_no_leftover_waiter,
            fifo_order_across_clients,
            reentrancy_by_guard,
            local_owners_exclude_each_other,
            release_by_drop_and_by_release,
            forced_break_reports_loss,
            release_right_after_a_break_reports_loss,
            cooperative_revoke,
            cancelled_acquire_at_each_await_point_leaves_nothing,
            cancelled_acquire_of_free_lock_leaves_no_holder,
            thousand_locks_on_one_session,
            invalid_names_rejected_and_nothing_written,
            any_names_work,
            nested_layout_segment_names_are_independent,
            inspect_reports_holder_and_waiters_in_order,
            loss_future_outlives_guard_and_fires_on_client_close,
            dropped_client_ends_its_session,
            multi_lock_opposite_orders_never_deadlock,
            multi_lock_all_or_nothing,
            multi_lock_loss_of_one_is_loss_of_set,
            scoped_run_stops_work_on_loss,
            fenced_writes_refused_after_loss,
            fenced_writes_cannot_touch_bookkeeping,
            fenced_keys_with_or_without_a_leading_slash,
            another_namespace_never_purges_live_entries,
            list_reports_locks_under_a_prefix,
            kill_session_refuses_a_malformed_id,
            holder_values_seen_by_another_client,
            hold_limit_ends_a_hold_its_holder_keeps,
            hold_limit_ends_an_upgrade_with_its_read_hold
        );
        $crate::__quorumlock_conformance_expand!($harness; [RwLock, Semaphore];
            holder_values_on_every_kind,
            multi_lock_of_kinds_shares_excludes_and_never_deadlocks,
            fenced_writes_over_a_set_of_kinds
        );
        $crate::__quorumlock_conformance_expand!($harness; [];
            election_campaign_resign_and_proclaim,
            election_observe_sees_changes,
            election_leader_makes_fenced_writes,
            election_revoke_then_resign_hands_over,
            values_that_look_like_markers_are_values
        );
        $crate::__quorumlock_conformance_expand!($harness; [KillSession];
            election_leader_lost_with_its_session
        );
        $crate::__quorumlock_conformance_expand!($harness; [Changes];
            election_observe_sees_every_short_leadership,
            watch_sends_nothing_while_nothing_changes
        );
        $crate::__quorumlock_conformance_expand!($harness; [KillSession];
            session_expiry_fires_loss_and_waiter_gets_larger_token,
            new_session_after_loss
        );
        mod rwlock {
            use super::*;
            $crate::__quorumlock_conformance_expand!($harness; [RwLock];
                rw_readers_overlap,
                rw_writer_excludes_readers_and_writers,
                rw_writer_not_starved_by_readers,
                rw_downgrade_allowed_upgrade_refused,
                rw_upgradeable_read_upgrades_after_readers_drain,
                rw_upgrade_refused_while_a_reader_waits_behind_a_writer,
                rw_owners_in_one_client,
                rw_mutex_and_readers_exclude,
                rw_reader_between_repeated_mutex_cycles,
                rw_writer_after_reads_shared_with_another_client,
                tokens_increase_across_kinds
            );
            mod write_side {
                use super::*;
                $crate::__quorumlock_conformance_flavored!(
                    ($harness).map(|h: $crate::Harness| h.with_flavor($crate::Flavor::RwWrite));
                    RwLock
                );
            }
        }
        mod semaphore {
            use super::*;
            $crate::__quorumlock_conformance_expand!($harness; [Semaphore];
                semaphore_never_exceeds_permits,
                semaphore_permit_count_conflict,
                semaphore_fifo,
                semaphore_permits_per_client,
                semaphore_acquire_many_is_atomic_and_in_order
            );
            mod one_permit {
                use super::*;
                $crate::__quorumlock_conformance_flavored!(
                    ($harness).map(|h: $crate::Harness| h.with_flavor($crate::Flavor::Semaphore1));
                    Semaphore
                );
            }
        }
    };
}

/// The mutex cases that also run on a semaphore of one permit and on the
/// write side of a read-write lock, needing `$need` (and the kill cases
/// `KillSession` too).
#[doc(hidden)]
#[macro_export]
macro_rules! __quorumlock_conformance_flavored {
    ($h:expr; $need:ident) => {
        $crate::__quorumlock_conformance_expand!($h; [$need];
            exclusion_under_contention,
            local_owners_exclude_each_other,
            tokens_strictly_increase,
            try_acquire_when_held,
            timeouts_of_any_length,
            holder_between_repeated_cycles,
            timeout_bounds_and_no_leftover_waiter,
            fifo_order_across_clients,
            release_by_drop_and_by_release,
            forced_break_reports_loss,
            release_right_after_a_break_reports_loss,
            cooperative_revoke,
            cancelled_acquire_at_each_await_point_leaves_nothing,
            cancelled_acquire_of_free_lock_leaves_no_holder
        );
        $crate::__quorumlock_conformance_expand!($h; [$need, KillSession];
            session_expiry_fires_loss_and_waiter_gets_larger_token
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __quorumlock_conformance_expand {
    (@needs $needs:expr; $h:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(harness) = $h else { return };
                if !harness.supports(stringify!($case), $needs).await {
                    return;
                }
                $crate::cases::$case(&harness).await;
            }
        )*
    };
    ($h:expr; [$($need:ident),*]; $($case:ident),* $(,)?) => {
        $crate::__quorumlock_conformance_expand!(
            @needs &[$($crate::Needs::$need),*]; $h; $($case),*
        );
    };
}

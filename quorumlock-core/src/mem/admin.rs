//! The operator's operations on a mem store: inspect, list, break,
//! revoke, kill a session, and what a test finds left behind.

use super::core::MemCore;
use super::store;
use crate::{Error, ErrorKind, LockName, LockState, LossReason, Result};

impl MemCore {
    pub(super) fn inspect(&self, name: &LockName) -> LockState {
        self.count_request();
        let (holders, waiters) = self.store().state().contenders(&self.key(name));
        LockState {
            name: name.clone(),
            holders,
            waiters,
        }
    }

    pub(super) fn list(&self, prefix: Option<&LockName>) -> Vec<LockState> {
        self.count_request();
        let under = self.config.namespace.prefix();
        let st = self.store().state();
        let key = prefix.map(|p| self.key(p));
        let mut out = Vec::new();
        for k in st.keys_under(&under, key.as_deref()) {
            let Some(name) = LockName::from_key(&k[under.len()..]) else {
                continue;
            };
            let (holders, waiters) = st.contenders(&k);
            out.push(LockState {
                name,
                holders,
                waiters,
            });
        }
        out
    }

    pub(super) fn break_lock(&self, name: &LockName) -> bool {
        self.count_request();
        self.store().state().break_holders(&self.key(name))
    }

    pub(super) fn request_revoke(&self, name: &LockName) -> bool {
        self.count_request();
        self.store().state().revoke_holders(&self.key(name))
    }

    pub(super) fn kill_session(&self, session: &str) -> Result<()> {
        self.count_request();
        let id = store::parse_session_id(session).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{session:?} is not a mem session id"),
            )
        })?;
        // Idempotent, as the stores are: a session already gone is fine.
        self.store()
            .state()
            .end_session(id, LossReason::SessionExpired);
        Ok(())
    }

    pub(super) fn leftovers(&self) -> Vec<String> {
        let st = self.store().state();
        let mut out = st.entries_under(&self.config.namespace.prefix());
        for id in self.opened.lock().expect("poisoned").iter() {
            if st.session_exists(*id) {
                out.push(format!("session {}", store::session_id(*id)));
            }
        }
        out
    }
}

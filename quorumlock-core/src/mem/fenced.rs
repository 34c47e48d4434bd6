//! Writes the store fences with the holder's entries, and plain key reads
//! and writes, on the store's own key-value map.

use super::core::MemCore;
use super::store;
use crate::backend::{check_kinds, refused, HeldEntry, KeyWrite};
use crate::Result;

impl MemCore {
    pub(super) fn fenced_write(&self, held: &[HeldEntry], write: &KeyWrite) -> Result<()> {
        write.validate(&self.config.namespace.prefix())?;
        check_kinds(held)?;
        self.count_request();
        let mut st = self.store().state();
        let all_there = held.iter().all(|h| {
            store::parse_entry_name(&h.entry)
                .is_some_and(|(key, index)| st.entry_exists(key, index))
        });
        if !all_there {
            return Err(refused(write, held));
        }
        st.kv_write(write);
        Ok(())
    }

    pub(super) fn read_key(&self, key: &str) -> Result<Option<Vec<u8>>> {
        KeyWrite::Delete { key: key.into() }.validate(&self.config.namespace.prefix())?;
        self.count_request();
        Ok(self.store().state().kv_get(key))
    }

    pub(super) fn write_key(&self, write: &KeyWrite) -> Result<()> {
        write.validate(&self.config.namespace.prefix())?;
        self.count_request();
        self.store().state().kv_write(write);
        Ok(())
    }
}

//! `list`: every lock key under the prefix, each judged as a reader sees it.

use super::EtcdStore;
use super::client;
use super::read::{View, read_key};
use crate::error::Result;
use crate::key::LockKey;
use crate::store::{Current, Listed};

impl EtcdStore {
    /// Every lock, read in one range request (and each one's lease).
    pub(super) fn list_locks(&self) -> Result<Vec<Listed>> {
        let prefix = format!("{}locks/", self.config.prefix);
        self.call(|mut c, _| {
            let prefix = prefix.clone();
            async move {
                let resp = c.range(client::get_prefix(&prefix)).await?;
                let mut locks = Vec::new();
                for kv in &resp.kvs {
                    let Ok(full) = std::str::from_utf8(&kv.key) else {
                        continue;
                    };
                    let Some(name) = full.strip_prefix(&prefix) else {
                        continue;
                    };
                    let Some(key) = LockKey::from_name(name) else {
                        continue;
                    };
                    let seen = read_key(&mut c, full, View::Reader).await?;
                    if seen.current == Current::Free {
                        continue;
                    }
                    locks.push(Listed::new(key, full.to_owned(), seen.current));
                }
                Ok(locks)
            }
        })
    }
}

//! The namespace of a backend instance (the URL path) and the store keys
//! it prefixes, the same on every store.

use std::fmt;

use crate::url::Url;
use crate::{Error, ErrorKind, LockName, Result};

/// The namespace: `""` for none, else the URL path without its leading
/// and trailing `/`, each segment checked like a lock name segment
/// (except that `leases` and `locks`, reserved in nested lock names, are
/// allowed: a namespace is no lock's child).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Namespace {
    /// The namespace of `url` (its path), checked.
    pub fn from_url(url: &Url) -> Result<Self> {
        Self::new(url.path())
    }

    /// The namespace `path` (leading and trailing `/` ignored), checked.
    pub fn new(path: &str) -> Result<Self> {
        let path = path.trim_matches('/');
        if path.is_empty() {
            return Ok(Namespace::default());
        }
        crate::name::validate_namespace(path).map_err(|e| {
            Error::new(
                ErrorKind::InvalidUrl,
                format!("the URL path is the namespace, and {}", e.message()),
            )
        })?;
        Ok(Namespace(path.to_string()))
    }

    /// The namespace as text, `""` for none.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether there is no namespace.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key of lock `name`: `<namespace>/<key>`, or `<key>` without a
    /// namespace, where `<key>` is [`LockName::key`] (the name itself, or
    /// its escaped form). Each store lays its entries out under it.
    pub fn lock_key(&self, name: &LockName) -> String {
        match self.0.as_str() {
            "" => name.key().into_owned(),
            ns => format!("{ns}/{}", name.key()),
        }
    }

    /// The lock whose [`lock_key`](Namespace::lock_key) is `key`, if any:
    /// what listing a store uses to turn keys back into names. `None` for
    /// keys outside the namespace and for keys no name is written as.
    pub fn name_of(&self, key: &str) -> Option<LockName> {
        let rest = key.strip_prefix(self.prefix().as_str())?;
        LockName::from_key(rest)
    }

    /// What every key of this namespace starts with: `<namespace>/`, or
    /// `""` without a namespace.
    pub fn prefix(&self) -> String {
        match self.0.as_str() {
            "" => String::new(),
            ns => format!("{ns}/"),
        }
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<&str> for Namespace {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_prefix() {
        let name = LockName::new("a/b").unwrap();
        let none = Namespace::new("/").unwrap();
        assert!(none.is_empty());
        assert_eq!(
            (none.lock_key(&name), none.prefix()),
            ("a/b".into(), "".into())
        );
        let ns = Namespace::new("/app/locks/").unwrap();
        assert_eq!(ns, "app/locks");
        assert_eq!(ns.lock_key(&name), "app/locks/a/b");
        assert_eq!(ns.prefix(), "app/locks/");
        let odd = LockName::new("orders/42").unwrap();
        assert_eq!(ns.lock_key(&odd), "app/locks/orders/~42");
        assert_eq!(ns.name_of("app/locks/orders/~42"), Some(odd.clone()));
        assert_eq!(none.name_of("orders/~42"), Some(odd));
        assert_eq!(ns.name_of("other/orders/~42"), None);
    }

    #[test]
    fn bad_namespace_is_invalid_url() {
        for bad in ["/a//b", "/a/%20b"] {
            let e = Namespace::new(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{bad}");
        }
        let u = crate::url::parse("zk://h:1/a/b/").unwrap();
        assert_eq!(Namespace::from_url(&u).unwrap(), "a/b");
    }
}

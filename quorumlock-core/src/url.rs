//! URL helpers shared by every backend's `config.rs`: option parsing with
//! typed errors (the options every store takes to connect parsed once,
//! [`Options::connect_options`]), the checks a typed configuration gets
//! against the bounds of its URL form ([`check_duration`] and its
//! neighbours), percent-decoding of credentials, and secret redaction
//! (the namespace from the path is [`crate::backend::Namespace`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use url::Url;

use crate::backend::connect::{MAX_CONNECT_TIMEOUT, MIN_CONNECT_TIMEOUT};
use crate::{Error, ErrorKind, Result};

/// A secret (password, token): never shown by `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    /// The secret itself, for the one place that sends it to the store.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Query parameters whose values are secrets.
const SECRET_PARAMS: [&str; 3] = ["token", "password", "secret"];

/// The URL as text with the password and secret query values replaced by
/// `***`, for `Debug`, `Display` and logs.
pub fn redact(url: &Url) -> String {
    let mut u = url.clone();
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    let pairs: Vec<(String, String)> = u
        .query_pairs()
        .map(|(k, v)| {
            let v = if SECRET_PARAMS.contains(&k.as_ref()) {
                "***".to_string()
            } else {
                v.into_owned()
            };
            (k.into_owned(), v)
        })
        .collect();
    if !pairs.is_empty() {
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// Parses `url` with a typed error that never echoes the password.
pub fn parse(url: &str) -> Result<Url> {
    Url::parse(url).map_err(|e| {
        Error::new(
            ErrorKind::InvalidUrl,
            format!("cannot parse the store URL: {e}"),
        )
    })
}

/// Decodes the `%XX` escapes of a URL's user info (`what`: "user name",
/// "password", for the error). A bad escape or a result that is not UTF-8
/// is [`ErrorKind::InvalidUrl`].
pub fn percent_decode(s: &str, what: &str) -> Result<String> {
    let bad = |why: &str| Error::new(ErrorKind::InvalidUrl, format!("the URL {what} {why}"));
    // percent-encoding passes a malformed escape through as text; the
    // store would then see a credential nobody meant.
    let bytes = s.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
        {
            return Err(bad("has a bad %-escape"));
        }
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| bad("is not UTF-8"))
}

/// Query options of a URL, taken one by one; anything left at the end is
/// an unknown option and an error (a typo must not be silently ignored).
#[derive(Debug)]
pub struct Options {
    scheme: String,
    pairs: BTreeMap<String, String>,
}

impl Options {
    /// Collects the query options; a repeated key is an error.
    pub fn new(url: &Url) -> Result<Self> {
        let mut pairs = BTreeMap::new();
        for (k, v) in url.query_pairs() {
            if pairs.insert(k.to_string(), v.to_string()).is_some() {
                return Err(Error::new(
                    ErrorKind::InvalidUrl,
                    format!("URL option {k:?} is given twice"),
                ));
            }
        }
        Ok(Options {
            scheme: url.scheme().to_string(),
            pairs,
        })
    }

    /// Whether `key` is given (and not taken yet).
    pub fn has(&self, key: &str) -> bool {
        self.pairs.contains_key(key)
    }

    /// The raw value of `key`, if given.
    pub fn take(&mut self, key: &str) -> Option<String> {
        self.pairs.remove(key)
    }

    /// A duration option (`500ms`, `10s`, `2m`, `1h`) within `min..=max`.
    pub fn duration(
        &mut self,
        key: &str,
        default: Duration,
        min: Duration,
        max: Duration,
    ) -> Result<Duration> {
        let Some(v) = self.take(key) else {
            return Ok(default);
        };
        let d = parse_duration(&v).map_err(|why| {
            Error::new(
                ErrorKind::InvalidUrl,
                format!("URL option {key}={v:?}: {why}"),
            )
        })?;
        if d < min || d > max {
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                format!("URL option {key}={v:?} is out of range {min:?}..={max:?}"),
            ));
        }
        Ok(d)
    }

    /// A boolean option (`true`/`false`/`1`/`0`).
    pub fn flag(&mut self, key: &str, default: bool) -> Result<bool> {
        match self.take(key).as_deref() {
            None => Ok(default),
            Some("true" | "1" | "yes") => Ok(true),
            Some("false" | "0" | "no") => Ok(false),
            Some(v) => Err(Error::new(
                ErrorKind::InvalidUrl,
                format!("URL option {key}={v:?} is not a boolean"),
            )),
        }
    }

    /// A whole-number option in `min..=max`, `default` when absent.
    pub fn number(&mut self, key: &str, default: u32, min: u32, max: u32) -> Result<u32> {
        let Some(v) = self.take(key) else {
            return Ok(default);
        };
        match v.parse::<u32>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(Error::new(
                ErrorKind::InvalidUrl,
                format!("URL option {key}={v:?} is not a whole number in {min}..={max}"),
            )),
        }
    }

    /// The TLS file options `ca=`, `cert=` and `key=`, as `(ca, cert, key)`:
    /// each absent or a non-empty path, `cert=` and `key=` together.
    /// `plain`: why they are refused when the URL's scheme does not use TLS
    /// (e.g. `"needs rediss:// (plain redis:// does not use TLS)"`).
    pub fn tls_files(
        &mut self,
        plain: Option<&str>,
    ) -> Result<(Option<PathBuf>, Option<PathBuf>, Option<PathBuf>)> {
        let invalid = |msg: String| Error::new(ErrorKind::InvalidUrl, msg);
        let mut file = |key: &str| match (self.take(key), plain) {
            (None, _) => Ok(None),
            (Some(_), Some(why)) => Err(invalid(format!("URL option {key}= {why}"))),
            (Some(p), None) if p.is_empty() => Err(invalid(format!("URL option {key}= is empty"))),
            (Some(p), None) => Ok(Some(PathBuf::from(p))),
        };
        let ca = file("ca")?;
        let cert = file("cert")?;
        let key = file("key")?;
        if cert.is_some() != key.is_some() {
            return Err(invalid("URL options cert= and key= go together".into()));
        }
        Ok((ca, cert, key))
    }

    /// The options every network store's URL takes to connect, parsed the
    /// same way for each: `connect_timeout=` (`default_connect_timeout`
    /// when absent, within [`MIN_CONNECT_TIMEOUT`]`..=`[`MAX_CONNECT_TIMEOUT`])
    /// and `lazy=` (a boolean, `false` when absent).
    pub fn connect_options(&mut self, default_connect_timeout: Duration) -> Result<ConnectOptions> {
        let connect_timeout = self.duration(
            "connect_timeout",
            default_connect_timeout,
            MIN_CONNECT_TIMEOUT,
            MAX_CONNECT_TIMEOUT,
        )?;
        let lazy = self.flag("lazy", false)?;
        Ok(ConnectOptions {
            connect_timeout,
            lazy,
        })
    }

    /// Fails on any option not taken, naming the options this scheme knows.
    pub fn finish(self, known: &[&str]) -> Result<()> {
        if let Some(k) = self.pairs.keys().next() {
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                format!(
                    "unknown URL option {k:?} for {}:// (known: {})",
                    self.scheme,
                    known.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// The URL options every network store takes to connect
/// ([`Options::connect_options`]); each store's config keeps them as its
/// `connect_timeout` and `lazy` fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// `connect_timeout=`: how long `connect()` waits for the store to
    /// answer.
    pub connect_timeout: Duration,
    /// `lazy=`: `connect()` sends nothing; the first use finds out whether
    /// the store answers.
    pub lazy: bool,
}

/// The error of a typed configuration that breaks a rule of its URL form:
/// [`ErrorKind::InvalidArgument`] (a URL breaking it is
/// [`ErrorKind::InvalidUrl`]). `msg` names the field and the rule, never a
/// secret's value.
pub fn invalid_config(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg.into())
}

/// Checks a duration field of a typed configuration against the bounds of
/// its URL option: outside `min..=max` is [`invalid_config`], naming
/// `field` and the bounds.
pub fn check_duration(field: &str, value: Duration, min: Duration, max: Duration) -> Result<()> {
    if value < min || value > max {
        return Err(invalid_config(format!(
            "{field}={value:?} is out of range {min:?}..={max:?}"
        )));
    }
    Ok(())
}

/// [`check_duration`] of a typed configuration's `connect_timeout`, with
/// the bounds of `connect_timeout=` ([`Options::connect_options`]).
pub fn check_connect_timeout(value: Duration) -> Result<()> {
    check_duration(
        "connect_timeout",
        value,
        MIN_CONNECT_TIMEOUT,
        MAX_CONNECT_TIMEOUT,
    )
}

/// The rules of [`Options::tls_files`] for a typed configuration's TLS
/// files, given as `[(field, path); 3]` in the order CA, client
/// certificate, client key: each absent or a non-empty path, the
/// certificate and the key together, and none of them when `plain` says
/// why the configuration does not use TLS (e.g. `"needs tls (rediss://)"`).
/// Breaking one is [`invalid_config`], naming the field.
pub fn check_tls_files(files: [(&str, Option<&Path>); 3], plain: Option<&str>) -> Result<()> {
    for (field, path) in files {
        match (path, plain) {
            (None, _) => {}
            (Some(_), Some(why)) => return Err(invalid_config(format!("{field} {why}"))),
            (Some(p), None) if p.as_os_str().is_empty() => {
                return Err(invalid_config(format!("{field} is an empty path")))
            }
            (Some(_), None) => {}
        }
    }
    let [_, (cert, c), (key, k)] = files;
    if c.is_some() != k.is_some() {
        return Err(invalid_config(format!("{cert} and {key} go together")));
    }
    Ok(())
}

/// Parses a duration: `humantime`'s forms (`250ms`, `1.5s`, `10s`,
/// `1m30s`, `2h`), or a bare number of seconds (`0`, `5`, `0.5`), as
/// `flock -w` takes it.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
        return Duration::try_from_secs_f64(secs).map_err(|e| e.to_string());
    }
    humantime::parse_duration(s).map_err(|e| format!("{e} (e.g. 250ms, 1.5s, 10s, 1m30s)"))
}

/// Writes the consuming `with_<field>` setter of every listed field of a
/// config type (the convention every backend's config follows, so that a
/// new option is a field, its setter, its URL parameter and a README
/// line):
///
/// ```
/// #[derive(Default)]
/// #[non_exhaustive]
/// pub struct MyConfig {
///     /// Session TTL.
///     pub ttl: std::time::Duration,
/// }
/// quorumlock_core::config_setters!(MyConfig { with_ttl => ttl: std::time::Duration });
/// let c = MyConfig::default().with_ttl(std::time::Duration::from_secs(3));
/// assert_eq!(c.ttl.as_secs(), 3);
/// ```
#[macro_export]
macro_rules! config_setters {
    ($ty:ty { $($setter:ident => $field:ident : $fty:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $setter(mut self, v: $fty) -> Self {
                    self.$field = v;
                    self
                }
            )*
        }
    };
}

/// An environment lookup: `std::env::var` in production, a closure over a
/// map in tests (so that tests never change the process's environment,
/// which other tests read at the same time).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as an [`Env`]; unset and empty are the same.
pub fn process_env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_humantime_and_bare_seconds() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("1.5s").unwrap(), ms(1500));
        assert_eq!(parse_duration("1m30s").unwrap(), ms(90_000));
        assert_eq!(parse_duration("250ms").unwrap(), ms(250));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("5").unwrap(), ms(5000));
        assert_eq!(parse_duration("0.5").unwrap(), ms(500));
        for bad in ["", "soon", "1.2.3", "-1s", "5 parsecs"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn redacts_password_and_token() {
        let u = parse("etcd://alice:hunter2@127.0.0.1:2379/ns?token=abc&ttl=5s").unwrap();
        let r = redact(&u);
        assert!(!r.contains("hunter2") && !r.contains("abc"), "{r}");
        assert!(r.contains("alice") && r.contains("ttl=5s"), "{r}");
        assert_eq!(format!("{:?}", Secret::new("hunter2")), "\"<redacted>\"");
    }

    #[test]
    fn durations_and_unknown_options() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("abc").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        let u = parse("mem://x/ns?ttl=2s&tll=3s").unwrap();
        let mut o = Options::new(&u).unwrap();
        let ttl = o
            .duration("ttl", Duration::from_secs(1), Duration::ZERO, Duration::MAX)
            .unwrap();
        assert_eq!(ttl, Duration::from_secs(2));
        let e = o.finish(&["ttl"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl);
        assert!(e.to_string().contains("tll"), "{e}");
        let u = parse("mem://x?ttl=1ms").unwrap();
        let e = Options::new(&u)
            .unwrap()
            .duration(
                "ttl",
                Duration::from_secs(1),
                Duration::from_millis(100),
                Duration::MAX,
            )
            .unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
    }

    #[test]
    fn connect_options_parse_once() {
        let opts = |q: &str| Options::new(&parse(&format!("s://h/?{q}")).unwrap()).unwrap();
        let d = Duration::from_secs(5);
        let c = opts("").connect_options(d).unwrap();
        assert_eq!((c.connect_timeout, c.lazy), (d, false));
        let c = opts("connect_timeout=250ms&lazy=1")
            .connect_options(d)
            .unwrap();
        assert_eq!(
            (c.connect_timeout, c.lazy),
            (Duration::from_millis(250), true)
        );
        for bad in ["connect_timeout=0s", "connect_timeout=11m", "lazy=maybe"] {
            let e = opts(bad).connect_options(d).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{bad}: {e}");
        }
    }

    #[test]
    fn typed_config_checks_name_the_field_and_bound() {
        let s = Duration::from_secs;
        check_duration("ttl", s(2), s(2), s(3)).unwrap();
        let e = check_duration("ttl", Duration::ZERO, s(2), s(3)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.message(), "ttl=0ns is out of range 2s..=3s");
        let e = check_connect_timeout(Duration::ZERO).unwrap_err();
        assert!(e.message().starts_with("connect_timeout=0ns"), "{e}");
        check_connect_timeout(s(1)).unwrap();
        fn p(s: &str) -> Option<&Path> {
            (!s.is_empty()).then(|| Path::new(s))
        }
        let f =
            |c: &'static str, k: &'static str| [("ca", p("/ca")), ("cert", p(c)), ("key", p(k))];
        check_tls_files(f("/c", "/k"), None).unwrap();
        let e = check_tls_files(f("/c", ""), None).unwrap_err();
        assert_eq!(e.message(), "cert and key go together");
        let e = check_tls_files(f("", ""), Some("needs tls")).unwrap_err();
        assert_eq!(e.message(), "ca needs tls");
        let e = check_tls_files(
            [("ca", Some(Path::new(""))), ("c", None), ("k", None)],
            None,
        )
        .unwrap_err();
        assert_eq!(e.message(), "ca is an empty path");
    }

    #[test]
    fn percent_decode_checks_escapes() {
        assert_eq!(percent_decode("a%40b%2Fc", "user").unwrap(), "a@b/c");
        for bad in ["a%4", "a%zz", "%"] {
            let e = percent_decode(bad, "password").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidUrl, "{bad}");
            assert!(e.to_string().contains("password"), "{e}");
        }
        let e = percent_decode("%ff", "user").unwrap_err();
        assert!(e.to_string().contains("UTF-8"), "{e}");
    }
}

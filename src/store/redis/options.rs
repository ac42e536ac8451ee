//! [`RedisOptions`]: what a URL cannot say about a connection (a CA, a client certificate,
//! the prefix checked at connect, the sentinels' credentials, the route of the calls).

use std::fmt;

use redis::{ClientTlsConfig, TlsCertificates};

use crate::error::StoreError;

use super::keys::escape_into;
use super::DEFAULT_PREFIX;

/// How [`RedisStore::connect_with`](super::RedisStore::connect_with) connects, beyond the URL.
///
/// With TLS (`rediss://`) the server's certificate is verified against the system's roots
/// (the platform's store, or the file named by `SSL_CERT_FILE`) unless
/// [`ca_pem`](Self::ca_pem) names the CA to trust instead; verification is skipped only
/// when asked for by name: `#insecure` at the end of the URL (`rediss://host:6380/#insecure`).
///
/// ```no_run
/// use tollgate::store::{RedisOptions, RedisStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let options = RedisOptions::new()
///     .prefix("myapp")
///     .ca_pem(std::fs::read("/etc/redis/ca.pem")?)
///     .client_cert_pem(std::fs::read("client.pem")?, std::fs::read("client.key")?);
/// let store = RedisStore::connect_with("rediss://redis.internal:6380/", options).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct RedisOptions {
    pub(super) prefix: Option<Vec<u8>>,
    pub(super) ca: Option<Vec<u8>>,
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
    pub(super) sentinel_auth: Option<(String, String)>,
    /// `functions(false)`: the script even where functions are available.
    pub(super) script_only: bool,
}

impl RedisOptions {
    /// No CA of its own (the system's roots), no client certificate, the default prefix.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts every key of the store under `prefix` (default `"tollgate"`): stores with
    /// different prefixes share nothing, not even a refund's units. `connect` checks that
    /// the Redis user may use its keys (`~<prefix>:*`) and channel (`&<prefix>:deny-cache`).
    pub fn prefix(mut self, prefix: impl AsRef<[u8]>) -> Self {
        self.prefix = Some(prefix.as_ref().to_vec());
        self
    }

    /// Trusts the CA certificates in `pem` (PEM, one or more) for the servers' certificates,
    /// instead of the system's roots.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Sends this client certificate (PEM, the chain) with its private key (PEM) to a
    /// server that asks for one (`tls-auth-clients yes`).
    pub fn client_cert_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.client = Some((cert.into(), key.into()));
        self
    }

    /// The user and password of the sentinels themselves (the primary's are in the URL),
    /// where they require one. An empty user is the `default` user.
    pub fn sentinel_auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.sentinel_auth = Some((user.into(), password.into()));
        self
    }

    /// Whether decisions may run as a function (`FCALL`, the default where
    /// [`RedisStore`](super::RedisStore) says): `false` runs the script (`EVALSHA`) everywhere.
    pub fn functions(mut self, enabled: bool) -> Self {
        self.script_only = !enabled;
        self
    }

    /// The prefix as the store writes it (escaped).
    pub(super) fn escaped_prefix(&self) -> Vec<u8> {
        let mut escaped = Vec::new();
        escape_into(
            &mut escaped,
            self.prefix.as_deref().unwrap_or(DEFAULT_PREFIX.as_bytes()),
        );
        escaped
    }

    /// The certificates for redis's TLS config; `None` for the system's roots alone.
    pub(super) fn certificates(&self) -> Option<TlsCertificates> {
        if self.ca.is_none() && self.client.is_none() {
            return None;
        }
        Some(TlsCertificates {
            client_tls: self.client.as_ref().map(|(cert, key)| ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
            root_cert: self.ca.clone(),
        })
    }

    /// An error unless a `redis://` or `rediss://` URL (standalone or Cluster) can use what
    /// is set here.
    pub(super) fn check_for_url(&self, url: &str) -> Result<(), StoreError> {
        if self.sentinel_auth.is_some() {
            return Err(StoreError::Misconfigured(
                "RedisOptions::sentinel_auth is for a redis+sentinel:// URL".into(),
            ));
        }
        if self.certificates().is_some() && !url.trim_start().starts_with("rediss") {
            return Err(StoreError::Misconfigured(
                "a CA or client certificate was given for a URL without TLS: use rediss://".into(),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for RedisOptions {
    /// Says which parts are set, never their contents (keys, passwords).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field(
                "prefix",
                &self.prefix.as_deref().map(String::from_utf8_lossy),
            )
            .field("ca", &self.ca.is_some())
            .field("client_cert", &self.client.is_some())
            .field(
                "sentinel_auth",
                &self.sentinel_auth.as_ref().map(|(u, _)| u),
            )
            .field("script_only", &self.script_only)
            .finish()
    }
}

/// Makes `ring` the process's rustls provider unless the application chose one: rustls
/// cannot pick a default alone when several providers are enabled.
pub(super) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing the race to another installer is fine: a provider is then installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

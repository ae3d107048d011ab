//! TLS settings built from the configuration: the listener's (certificate,
//! key, client certificates checked against a CA as Redis's
//! `tls-auth-clients`) and the upstream's (CA, optional client certificate,
//! server name). Always the ring provider, named explicitly, so no other
//! provider is ever picked up from the build.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::Stream;
use crate::config::{AuthClients, Config};

/// A TLS setting that cannot be used, with the key and file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError(pub String);

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS listener's settings; `None` without `tls_listen`.
pub fn acceptor(config: &Config) -> Result<Option<TlsAcceptor>, TlsError> {
    if config.tls_listen.is_none() {
        return Ok(None);
    }
    let (cert, key) = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(c), Some(k)) => (c, k),
        _ => {
            return Err(TlsError(
                "tls_listen needs tls_cert_file and tls_key_file".into(),
            ))
        }
    };
    let certs = certificates("tls_cert_file", cert)?;
    let key = private_key("tls_key_file", key)?;
    let provider = provider();
    let verifier = match (config.tls_auth_clients, &config.tls_ca_cert_file) {
        (AuthClients::No, _) => WebPkiClientVerifier::no_client_auth(),
        (auth, Some(ca)) => {
            let roots = Arc::new(roots("tls_ca_cert_file", ca)?);
            let builder = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            let builder = if auth == AuthClients::Optional {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            builder
                .build()
                .map_err(|e| TlsError(format!("tls_ca_cert_file {}: {e}", ca.display())))?
        }
        (_, None) => {
            return Err(TlsError(
                "tls_auth_clients needs tls_ca_cert_file (or tls_auth_clients = \"no\")".into(),
            ))
        }
    };
    let server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            TlsError(format!(
                "tls_cert_file {} with tls_key_file {}: {e}",
                cert.display(),
                config
                    .tls_key_file
                    .as_deref()
                    .unwrap_or(Path::new(""))
                    .display()
            ))
        })?;
    Ok(Some(TlsAcceptor::from(Arc::new(server))))
}

/// How the proxy's connections to Redis (or to its sentinels) speak TLS.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    config: Arc<ClientConfig>,
    /// What the server's certificate must name; `None`: the host of the
    /// address dialed (a primary the sentinels name changes with them).
    pub server_name: Option<ServerName<'static>>,
}

/// The files and name of one side's TLS settings, and the prefix of their
/// settings' names for errors.
struct Files<'a> {
    prefix: &'static str,
    ca: Option<&'a Path>,
    cert: Option<&'a Path>,
    key: Option<&'a Path>,
    server_name: Option<String>,
}

impl UpstreamTls {
    /// Builds the settings; `None` without `upstream_tls`.
    pub fn from_config(config: &Config) -> Result<Option<UpstreamTls>, TlsError> {
        if !config.upstream_tls {
            return Ok(None);
        }
        let server_name = match (&config.upstream_tls_server_name, &config.upstream) {
            (Some(n), _) => Some(n.clone()),
            (None, Some(u)) => Some(host(u).to_string()),
            // Sentinel mode: whichever primary they name.
            (None, None) => None,
        };
        UpstreamTls::build(Files {
            prefix: "upstream_tls",
            ca: config.upstream_tls_ca_cert_file.as_deref(),
            cert: config.upstream_tls_cert_file.as_deref(),
            key: config.upstream_tls_key_file.as_deref(),
            server_name,
        })
        .map(Some)
    }

    /// The sentinels' settings; `None` without `sentinel_tls`. Each file
    /// not given is the upstream's.
    pub fn for_sentinels(config: &Config) -> Result<Option<UpstreamTls>, TlsError> {
        if !config.sentinel_tls {
            return Ok(None);
        }
        let (cert, key) = match (
            &config.sentinel_tls_cert_file,
            &config.sentinel_tls_key_file,
        ) {
            (None, None) => (
                &config.upstream_tls_cert_file,
                &config.upstream_tls_key_file,
            ),
            own => own,
        };
        UpstreamTls::build(Files {
            prefix: "sentinel_tls",
            ca: config
                .sentinel_tls_ca_cert_file
                .as_deref()
                .or(config.upstream_tls_ca_cert_file.as_deref()),
            cert: cert.as_deref(),
            key: key.as_deref(),
            server_name: config.sentinel_tls_server_name.clone(),
        })
        .map(Some)
    }

    fn build(files: Files<'_>) -> Result<UpstreamTls, TlsError> {
        let prefix = files.prefix;
        let Some(ca) = files.ca else {
            return Err(TlsError(format!("{prefix} needs {prefix}_ca_cert_file")));
        };
        let roots = roots(&format!("{prefix}_ca_cert_file"), ca)?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(e.to_string()))?
            .with_root_certificates(roots);
        let client = match (files.cert, files.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(
                    certificates(&format!("{prefix}_cert_file"), cert)?,
                    private_key(&format!("{prefix}_key_file"), key)?,
                )
                .map_err(|e| {
                    TlsError(format!(
                        "{prefix}_cert_file {} with {prefix}_key_file {}: {e}",
                        cert.display(),
                        key.display()
                    ))
                })?,
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(TlsError(format!(
                    "{prefix}_cert_file and {prefix}_key_file go together"
                )))
            }
        };
        let server_name = match files.server_name {
            Some(name) => Some(server_name(&name).ok_or_else(|| {
                TlsError(format!(
                    "{prefix}_server_name: {name:?} is not a DNS name or IP address"
                ))
            })?),
            None => None,
        };
        Ok(UpstreamTls {
            config: Arc::new(client),
            server_name,
        })
    }

    /// The TLS handshake on a connection just opened to `addr`.
    pub async fn connect(&self, tcp: TcpStream, addr: &str) -> std::io::Result<Stream> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => server_name(host(addr)).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{:?} is not a DNS name or IP address", host(addr)),
                )
            })?,
        };
        let tls = TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await?;
        Ok(Stream::Tls(Box::new(tls.into())))
    }
}

fn server_name(name: &str) -> Option<ServerName<'static>> {
    ServerName::try_from(name.to_string()).ok()
}

/// The TLS handshake of a client that connected to the TLS listener.
pub async fn accept(acceptor: &TlsAcceptor, tcp: TcpStream) -> std::io::Result<Stream> {
    let tls = acceptor.accept(tcp).await?;
    Ok(Stream::Tls(Box::new(tls.into())))
}

/// Why the TLS listener refused a client, when it did: what rustls found
/// wrong with the handshake (a certificate it does not accept, no common
/// version or cipher, bytes that are not TLS). `None` for a client that
/// went away (closed, reset) or any other error of the socket.
pub fn refusal(e: &std::io::Error) -> Option<String> {
    let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    Some(tls.to_string())
}

/// The host of `host:port` (`[v6]:port` too): the name a certificate is
/// checked against by default.
pub fn host(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

fn certificates(key: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |e: String| TlsError(format!("{key} {}: {e}", path.display()));
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

fn private_key(key: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PEM private key in it".to_string(),
            e => e.to_string(),
        };
        TlsError(format!("{key} {}: {why}", path.display()))
    })
}

fn roots(key: &str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(key, path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError(format!("{key} {}: {e}", path.display())))?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_an_address() {
        assert_eq!(host("127.0.0.1:6379"), "127.0.0.1");
        assert_eq!(host("redis.example:6380"), "redis.example");
        assert_eq!(host("[::1]:6379"), "::1");
    }

    #[test]
    fn missing_files_are_named() {
        let mut cfg = Config {
            tls_listen: Some("127.0.0.1:0".into()),
            tls_cert_file: Some("/nonexistent/cert.pem".into()),
            tls_key_file: Some("/nonexistent/key.pem".into()),
            tls_auth_clients: AuthClients::No,
            ..Config::default()
        };
        let err = acceptor(&cfg).err().expect("no cert file").0;
        assert!(
            err.starts_with("tls_cert_file /nonexistent/cert.pem:"),
            "{err}"
        );
        cfg.upstream = Some("127.0.0.1:6379".into());
        cfg.upstream_tls = true;
        cfg.upstream_tls_ca_cert_file = Some("/nonexistent/ca.pem".into());
        let err = UpstreamTls::from_config(&cfg).unwrap_err().0;
        assert!(
            err.starts_with("upstream_tls_ca_cert_file /nonexistent/ca.pem:"),
            "{err}"
        );
    }
}

//! TLS on both sides: `redis-cli --tls` and a tokio-rustls client talk to
//! the proxy's TLS listener (beside the plain one), the proxy talks to a
//! redis-server that speaks only TLS, client certificates are checked
//! against the configured CA, and clients that do not speak TLS on the TLS
//! port are dropped without hurting anyone else. Certificates are made
//! here, for each test, by rcgen.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

// ------------------------------------------------------------ certificates

/// A CA with a server and a client certificate it signed, and a client
/// certificate signed by another CA, in a directory of their own.
struct Pki {
    dir: PathBuf,
}

fn new_ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    (p.self_signed(&key).unwrap(), key)
}

/// A certificate for `localhost` and 127.0.0.1, good for either end.
fn new_leaf(name: &str, ca: &rcgen::Certificate, ca_key: &KeyPair) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = p.signed_by(&key, ca, ca_key).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("ackproxy-tls-{}", free_port()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (ca, ca_key) = new_ca("ackproxy test CA");
        let (rogue_ca, rogue_key) = new_ca("some other CA");
        let (server, server_key) = new_leaf("server", &ca, &ca_key);
        let (client, client_key) = new_leaf("client", &ca, &ca_key);
        let (rogue, rogue_leaf_key) = new_leaf("client", &rogue_ca, &rogue_key);
        for (name, text) in [
            ("ca.pem", ca.pem()),
            ("rogue-ca.pem", rogue_ca.pem()),
            ("server.pem", server),
            ("server.key", server_key),
            ("client.pem", client),
            ("client.key", client_key),
            ("rogue.pem", rogue),
            ("rogue.key", rogue_leaf_key),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }

    /// The settings of a TLS listener on `port` presenting the server
    /// certificate; `auth` is `tls_auth_clients`.
    fn listener_toml(&self, port: u16, auth: &str) -> String {
        format!(
            "tls_listen = \"127.0.0.1:{port}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"\n\
             tls_ca_cert_file = \"{}\"\ntls_auth_clients = \"{auth}\"\n",
            self.path("server.pem"),
            self.path("server.key"),
            self.path("ca.pem"),
        )
    }

    /// Upstream TLS settings: `ca` is checked against, `cert` ("client",
    /// "rogue") is presented if given.
    fn upstream_toml(&self, ca: &str, cert: Option<&str>) -> String {
        let mut s = format!(
            "upstream_tls = true\nupstream_tls_ca_cert_file = \"{}\"\n",
            self.path(ca)
        );
        if let Some(c) = cert {
            s += &format!(
                "upstream_tls_cert_file = \"{}\"\nupstream_tls_key_file = \"{}\"\n",
                self.path(&format!("{c}.pem")),
                self.path(&format!("{c}.key"))
            );
        }
        s
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// --------------------------------------------------------------- redis-cli

/// `redis-cli --tls` against `port`, trusting the test CA and presenting
/// `cert` ("client", "rogue") if given.
fn redis_cli(pki: &Pki, port: u16, cert: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new("redis-cli");
    cmd.args(["--tls", "--cacert", &pki.path("ca.pem")]).args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ]);
    if let Some(c) = cert {
        cmd.args(["--cert", &pki.path(&format!("{c}.pem"))])
            .args(["--key", &pki.path(&format!("{c}.key"))]);
    }
    cmd.args(args).output().expect("redis-cli")
}

fn cli_out(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

/// A redis-server that speaks only TLS (`--port 0`), requiring client
/// certificates signed by the test CA if `auth_clients`.
fn tls_redis(pki: &Pki, auth_clients: bool) -> Redis {
    let port = free_port();
    let port_s = port.to_string();
    let (ca, cert, key) = (
        pki.path("ca.pem"),
        pki.path("server.pem"),
        pki.path("server.key"),
    );
    let args = [
        "--port",
        "0",
        "--tls-port",
        &port_s,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        if auth_clients { "yes" } else { "no" },
    ];
    Redis::start_when(port, &args, || {
        cli_out(&redis_cli(pki, port, Some("client"), &["PING"])) == "PONG"
    })
}

// ------------------------------------------------------ tokio-rustls client

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn client_config(pki: &Pki, cert: Option<&str>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(pki.path("ca.pem")).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    Arc::new(match cert {
        Some(c) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_file(pki.path(&format!("{c}.pem"))).unwrap()],
                PrivateKeyDer::from_pem_file(pki.path(&format!("{c}.key"))).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    })
}

/// A RESP client over TLS that returns replies as raw bytes.
struct TlsClient {
    stream: tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    buf: Vec<u8>,
}

impl TlsClient {
    async fn connect(port: u16, config: Arc<rustls::ClientConfig>) -> std::io::Result<TlsClient> {
        // A small receive window: the proxy's writes of big replies find
        // the socket full, and what TLS could not send yet must be flushed.
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(4096)?;
        let tcp = socket
            .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .await?;
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await?;
        Ok(TlsClient {
            stream,
            buf: Vec::new(),
        })
    }

    async fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        self.stream.write_all(&Client::encode(args)).await?;
        self.stream.flush().await
    }

    async fn read_raw(&mut self) -> std::io::Result<Vec<u8>> {
        let deadline = Duration::from_secs(30);
        loop {
            let decoded = redis_protocol::resp2::decode::decode(&self.buf)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            if let Some((_, len)) = decoded {
                return Ok(self.buf.drain(..len).collect());
            }
            let mut chunk = vec![0u8; 64 * 1024];
            let n = tokio::time::timeout(deadline, self.stream.read(&mut chunk))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn cmd(&mut self, args: &[&str]) -> std::io::Result<Value> {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send(&a).await?;
        Ok(decode(&self.read_raw().await?).0)
    }
}

/// Whether a client presenting `cert` gets an answer to PING on the TLS
/// port (through the handshake and the proxy's own check of it).
fn rust_client_pings(pki: &Pki, port: u16, cert: Option<&str>) -> bool {
    runtime().block_on(async {
        let Ok(mut c) = TlsClient::connect(port, client_config(pki, cert)).await else {
            return false;
        };
        // With TLS 1.3 the server judges the client's certificate after
        // the client has finished its side: a refusal shows on reading.
        matches!(c.cmd(&["PING"]).await, Ok(Value::Simple(s)) if s == "PONG")
    })
}

/// A counter or gauge of the proxy's metrics endpoint.
fn metric(metrics_port: u16, name: &str) -> Option<u64> {
    let v = crate::common::metric(metrics_port, name);
    (v >= 0.0).then_some(v as u64)
}

fn wait_for_metric(metrics_port: u16, name: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = metric(metrics_port, name);
        if got == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {got:?}, want {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const QUEUE_RULE: &str = "\n[[queue]]\npattern = \"q*\"\nlease_ms = 600000\nack_id = \"payload\"\n";

// ------------------------------------------------------------------- tests

#[test]
fn redis_cli_over_tls_beside_the_plain_listener() {
    let pki = Pki::new();
    let redis = Redis::start();
    let tls_port = free_port();
    let proxy = Proxy::start_with_config(redis.port, &pki.listener_toml(tls_port, "no"), &[]);

    assert_eq!(cli_out(&redis_cli(&pki, tls_port, None, &["PING"])), "PONG");
    assert_eq!(
        cli_out(&redis_cli(&pki, tls_port, None, &["SET", "k", "over tls"])),
        "OK"
    );
    assert_eq!(
        cli_out(&redis_cli(&pki, tls_port, None, &["GET", "k"])),
        "over tls"
    );
    // The plain listener serves the same Redis at the same time.
    let mut plain = proxy.client();
    assert_eq!(plain.cmd(&["GET", "k"]), Value::bulk("over tls"));
    assert_eq!(
        plain.cmd(&["SET", "k", "plain"]),
        Value::Simple("OK".into())
    );
    assert_eq!(
        cli_out(&redis_cli(&pki, tls_port, None, &["GET", "k"])),
        "plain"
    );

    // Without the CA, redis-cli does not trust the proxy's certificate: the
    // proxy presents the one configured, nothing self-made.
    let out = Command::new("redis-cli")
        .args([
            "--tls",
            "-h",
            "127.0.0.1",
            "-p",
            &tls_port.to_string(),
            "PING",
        ])
        .output()
        .unwrap();
    assert_ne!(cli_out(&out), "PONG");
}

#[test]
fn rust_client_over_tls_shared_dedicated_and_queue() {
    let pki = Pki::new();
    let redis = Redis::start();
    let tls_port = free_port();
    let toml = pki.listener_toml(tls_port, "yes") + QUEUE_RULE;
    let _proxy = Proxy::start_with_config(redis.port, &toml, &[]);
    let config = client_config(&pki, Some("client"));

    runtime().block_on(async {
        let mut c = TlsClient::connect(tls_port, config).await.unwrap();
        assert_eq!(
            c.cmd(&["PING"]).await.unwrap(),
            Value::Simple("PONG".into())
        );

        // A pop on a queue key is leased; ACK releases it once.
        assert_eq!(
            c.cmd(&["LPUSH", "q1", "job-1"]).await.unwrap(),
            Value::Int(1)
        );
        assert_eq!(c.cmd(&["RPOP", "q1"]).await.unwrap(), Value::bulk("job-1"));
        assert_eq!(c.cmd(&["ACK", "q1", "job-1"]).await.unwrap(), Value::Int(1));
        assert_eq!(c.cmd(&["ACK", "q1", "job-1"]).await.unwrap(), Value::Int(0));

        // A deep pipeline in one write, answered in order.
        let mut batch = Vec::new();
        for _ in 0..2000 {
            batch.extend_from_slice(&Client::encode(&[b"INCR", b"n"]));
        }
        c.stream.write_all(&batch).await.unwrap();
        c.stream.flush().await.unwrap();
        for i in 1..=2000 {
            assert_eq!(decode(&c.read_raw().await.unwrap()).0, Value::Int(i));
        }

        // 3 MB each way: the request goes on a dedicated connection (1 MB
        // or more), the reply is written to the client in large writes.
        let big: Vec<u8> = (0..3 * 1024 * 1024)
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        c.send(&[b"SET", b"big", &big]).await.unwrap();
        assert_eq!(c.read_raw().await.unwrap(), b"+OK\r\n");
        for _ in 0..3 {
            c.send(&[b"GET", b"big"]).await.unwrap();
            assert_eq!(
                decode(&c.read_raw().await.unwrap()).0,
                Value::Bulk(big.clone())
            );
        }

        // A transaction pins the client to a dedicated connection.
        assert_eq!(c.cmd(&["MULTI"]).await.unwrap(), Value::Simple("OK".into()));
        assert_eq!(
            c.cmd(&["INCR", "n"]).await.unwrap(),
            Value::Simple("QUEUED".into())
        );
        assert_eq!(
            c.cmd(&["EXEC"]).await.unwrap(),
            Value::Array(vec![Value::Int(2001)])
        );
    });
}

#[test]
fn upstream_redis_speaking_only_tls() {
    let pki = Pki::new();
    let redis = tls_redis(&pki, false);
    let toml = pki.upstream_toml("ca.pem", None) + QUEUE_RULE;
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start_with_config(redis.port, &toml, &["--metrics", &metrics_addr]);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
    assert_eq!(
        cli_out(&redis_cli(&pki, redis.port, None, &["GET", "k"])),
        "v"
    );
    // 8 MB of requests in one pipeline, through the shared connection's
    // batched TLS writes, answered in order.
    let value = "v".repeat(16 * 1024);
    let mut batch = Vec::new();
    for i in 0..512 {
        let key = format!("p{i}");
        batch.extend_from_slice(&Client::encode(&[b"SET", key.as_bytes(), value.as_bytes()]));
    }
    c.send_raw(&batch);
    for _ in 0..512 {
        assert_eq!(c.read_raw(), b"+OK\r\n");
    }
    assert_eq!(c.cmd(&["STRLEN", "p511"]), Value::Int(16 * 1024));
    // A dedicated connection (the transaction), the proxy's scripts on
    // the shared one (the pop and its ACK).
    assert_eq!(c.cmd(&["MULTI"]), Value::Simple("OK".into()));
    assert_eq!(c.cmd(&["GET", "k"]), Value::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["EXEC"]), Value::bulks(&["v"]));
    assert_eq!(c.cmd(&["LPUSH", "q1", "a"]), Value::Int(1));
    assert_eq!(c.cmd(&["RPOP", "q1"]), Value::bulk("a"));
    assert_eq!(c.cmd(&["ACK", "q1", "a"]), Value::Int(1));

    // A pop parked in the proxy is woken by a push made straight to Redis:
    // the proxy's keyspace subscription runs over TLS too (Redis speaks
    // nothing else), and so does its CONFIG SET of the events it needs.
    c.send(&["BRPOP", "q2", "0"]);
    wait_for_metric(metrics, "ackproxy_parked_clients", 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let numsub = ["PUBSUB", "NUMSUB", "__keyspace@0__:q2"];
    while cli_out(&redis_cli(&pki, redis.port, None, &numsub)) != "__keyspace@0__:q2\n1" {
        assert!(Instant::now() < deadline, "the proxy never subscribed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let events = redis_cli(
        &pki,
        redis.port,
        None,
        &["CONFIG", "GET", "notify-keyspace-events"],
    );
    let events = cli_out(&events);
    assert!(events.contains('K') && events.contains('l'), "{events}");
    let pushed_at = Instant::now();
    let pushed = redis_cli(&pki, redis.port, None, &["LPUSH", "q2", "woken"]);
    assert_eq!(cli_out(&pushed), "1");
    assert_eq!(c.read_value(), Value::bulks(&["q2", "woken"]));
    // By the event, not by the once-a-second recheck of parked pops.
    let took = pushed_at.elapsed();
    assert!(took < Duration::from_millis(500), "woken after {took:?}");
    assert_eq!(c.cmd(&["ACK", "q2", "woken"]), Value::Int(1));
}

#[test]
fn upstream_requiring_a_client_certificate() {
    let pki = Pki::new();
    let redis = tls_redis(&pki, true);

    // The proxy presents the client certificate the CA signed.
    let toml = pki.upstream_toml("ca.pem", Some("client"));
    let proxy = Proxy::start_with_config(redis.port, &toml, &[]);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Value::Simple("OK".into()));
    assert_eq!(c.cmd(&["GET", "k"]), Value::bulk("v"));
    drop(proxy);

    // Without one, or with one of another CA, Redis refuses the proxy,
    // and clients are told at once.
    for cert in [None, Some("rogue")] {
        let port = free_port();
        let file = TempFile::new("ackproxy-test", "toml", &pki.upstream_toml("ca.pem", cert));
        let (listen, upstream) = (
            format!("127.0.0.1:{port}"),
            format!("127.0.0.1:{}", redis.port),
        );
        let args = [
            "--config",
            file.as_arg(),
            "--listen",
            &listen,
            "--upstream",
            &upstream,
        ];
        let _proxy = Proxy::start_when(port, &args, || Client::try_connect(port).is_ok());
        let mut c = Client::connect(port);
        match c.cmd(&["GET", "k"]) {
            Value::Error(e) => assert!(e.starts_with("ERR upstream"), "{cert:?}: {e}"),
            other => panic!("{cert:?}: Redis let the proxy in: {other:?}"),
        }
    }
}

#[test]
fn upstream_certificate_is_verified() {
    let pki = Pki::new();
    let redis = tls_redis(&pki, false);
    let upstream = format!("127.0.0.1:{}", redis.port);
    // Trusting another CA, and expecting another name: no connection.
    for (extra, why) in [
        (pki.upstream_toml("rogue-ca.pem", None), "UnknownIssuer"),
        (
            pki.upstream_toml("ca.pem", None) + "upstream_tls_server_name = \"other.example\"\n",
            "certificate not valid for name \"other.example\"",
        ),
    ] {
        let port = free_port();
        let file = TempFile::new("ackproxy-test", "toml", &extra);
        let listen = format!("127.0.0.1:{port}");
        let args = [
            "--config",
            file.as_arg(),
            "--listen",
            &listen,
            "--upstream",
            &upstream,
        ];
        let _proxy = Proxy::start_when(port, &args, || Client::try_connect(port).is_ok());
        match Client::connect(port).cmd(&["PING"]) {
            Value::Error(e) => {
                assert!(e.starts_with("ERR upstream unavailable: "), "{e}");
                assert!(e.contains("TLS handshake") && e.contains(why), "{e}");
            }
            other => panic!("connected to an unverified upstream: {other:?}"),
        }
    }
}

#[test]
fn client_certificates_are_checked_against_the_ca() {
    let pki = Pki::new();
    let redis = Redis::start();
    let (tls_port, metrics) = (free_port(), free_port());
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let _proxy = Proxy::start_with_config(
        redis.port,
        &pki.listener_toml(tls_port, "yes"),
        &["--metrics", &metrics_addr],
    );
    let failures = "ackproxy_tls_handshake_failures_total";
    wait_for_metric(metrics, failures, 0);

    assert!(rust_client_pings(&pki, tls_port, Some("client")));
    assert_eq!(
        cli_out(&redis_cli(&pki, tls_port, Some("client"), &["PING"])),
        "PONG"
    );
    // Signed by another CA, or no certificate at all: refused.
    assert!(!rust_client_pings(&pki, tls_port, Some("rogue")));
    assert!(!rust_client_pings(&pki, tls_port, None));
    assert_ne!(
        cli_out(&redis_cli(&pki, tls_port, Some("rogue"), &["PING"])),
        "PONG"
    );
    assert_ne!(cli_out(&redis_cli(&pki, tls_port, None, &["PING"])), "PONG");
    wait_for_metric(metrics, failures, 4);
    // The refusals cost nobody else anything.
    assert!(rust_client_pings(&pki, tls_port, Some("client")));
}

#[test]
fn optional_client_certificates() {
    let pki = Pki::new();
    let redis = Redis::start();
    let tls_port = free_port();
    let _proxy =
        Proxy::start_with_config(redis.port, &pki.listener_toml(tls_port, "optional"), &[]);
    assert!(rust_client_pings(&pki, tls_port, None));
    assert!(rust_client_pings(&pki, tls_port, Some("client")));
    // One that is presented must still be signed by the CA.
    assert!(!rust_client_pings(&pki, tls_port, Some("rogue")));
}

#[test]
fn clients_not_speaking_tls_are_dropped_alone() {
    let pki = Pki::new();
    let redis = Redis::start();
    let tls_port = free_port();
    let proxy = Proxy::start_with_config(redis.port, &pki.listener_toml(tls_port, "no"), &[]);

    // A client that connects and says nothing: its handshake waits in its
    // own task, and everyone else is served meanwhile.
    let silent = std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    assert!(rust_client_pings(&pki, tls_port, None));

    // Plain RESP on the TLS port: no reply, the connection is closed.
    let mut plain_on_tls = std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    plain_on_tls.write_all(&Client::encode(&[b"PING"])).unwrap();
    let got = read_to_close(&mut plain_on_tls);
    assert!(
        !got.windows(4).any(|w| w == b"PONG"),
        "plain client answered on the TLS port: {got:?}"
    );
    // Garbage that looks like the start of a TLS record, then a close.
    let mut junk = std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap();
    junk.write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3])
        .unwrap();
    junk.shutdown(std::net::Shutdown::Write).unwrap();
    let _ = read_to_close(&mut junk);

    assert!(rust_client_pings(&pki, tls_port, None));
    assert_eq!(proxy.client().cmd(&["PING"]), Value::Simple("PONG".into()));
    // The silent client is still connected (no reply, no close yet).
    silent
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut one = [0u8; 1];
    let still_open = matches!((&silent).read(&mut one), Err(e)
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut));
    assert!(
        still_open,
        "a silent client was closed before its handshake timed out"
    );
}

/// A TLS client past `maxclients` gets Redis's refusal, over TLS.
#[test]
fn maxclients_counts_tls_clients() {
    let pki = Pki::new();
    let redis = Redis::start();
    let (tls_port, metrics) = (free_port(), free_port());
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let toml = pki.listener_toml(tls_port, "no") + "\n[limits]\nmaxclients = 1\n";
    let _proxy = Proxy::start_with_config(redis.port, &toml, &["--metrics", &metrics_addr]);
    // The harness's PING connection counts until the proxy has seen it go.
    wait_for_metric(metrics, "ackproxy_connections_open", 0);
    runtime().block_on(async {
        let config = client_config(&pki, None);
        let mut first = TlsClient::connect(tls_port, config.clone()).await.unwrap();
        assert_eq!(
            first.cmd(&["PING"]).await.unwrap(),
            Value::Simple("PONG".into())
        );
        let mut second = TlsClient::connect(tls_port, config).await.unwrap();
        assert_eq!(
            second.read_raw().await.unwrap(),
            b"-ERR max number of clients reached\r\n"
        );
        assert_eq!(
            first.cmd(&["PING"]).await.unwrap(),
            Value::Simple("PONG".into())
        );
    });
}

#[test]
fn tls_only_proxy() {
    let pki = Pki::new();
    let redis = Redis::start();
    let tls_port = free_port();
    let path = pki.dir.join("tls-only.toml");
    std::fs::write(
        &path,
        format!("listen = \"\"\n{}", pki.listener_toml(tls_port, "no")),
    )
    .unwrap();
    let upstream = format!("127.0.0.1:{}", redis.port);
    let args = ["--config", path.to_str().unwrap(), "--upstream", &upstream];
    let _proxy = Proxy::start_when(tls_port, &args, || {
        cli_out(&redis_cli(&pki, tls_port, None, &["PING"])) == "PONG"
    });
    assert_eq!(
        cli_out(&redis_cli(&pki, tls_port, None, &["SET", "only", "tls"])),
        "OK"
    );
    assert_eq!(redis.client().cmd(&["GET", "only"]), Value::bulk("tls"));
}

/// `--check-config` loads the TLS files: a missing or wrong one stops it
/// with the setting and the file named.
#[test]
fn check_config_reads_the_tls_files() {
    let pki = Pki::new();
    let check = |toml: &str| {
        let path = pki.dir.join(format!("check-{}.toml", free_port()));
        std::fs::write(&path, toml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_ackproxy"))
            .args(["--check-config", "--config", path.to_str().unwrap()])
            .args(["--upstream", "127.0.0.1:6379"])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let port = free_port();
    let good = pki.listener_toml(port, "yes") + &pki.upstream_toml("ca.pem", Some("client"));
    let (code, stdout, stderr) = check(&good);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains(&format!("tls listen          127.0.0.1:{port}")),
        "{stdout}"
    );
    assert!(stdout.contains("client certificates required"), "{stdout}");
    assert!(stdout.contains("upstream tls        on"), "{stdout}");

    let missing = good.replace(&pki.path("server.pem"), "/nonexistent/server.pem");
    let (code, _, stderr) = check(&missing);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("tls_cert_file /nonexistent/server.pem: "),
        "{stderr}"
    );

    // A certificate where the key should be.
    let no_key = good.replace(&pki.path("client.key"), &pki.path("client.pem"));
    let (code, _, stderr) = check(&no_key);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("upstream_tls_key_file"), "{stderr}");
    assert!(stderr.contains("no PEM private key"), "{stderr}");

    // A client certificate check needs a CA (the listener's line only, not
    // the end of upstream_tls_ca_cert_file's).
    let no_ca = good.replacen(
        &format!("\ntls_ca_cert_file = \"{}\"\n", pki.path("ca.pem")),
        "\n",
        1,
    );
    let (code, _, stderr) = check(&no_ca);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains(":4: tls_auth_clients (default \"yes\") needs tls_ca_cert_file"),
        "{stderr}"
    );
}

/// The TLS section of docs/security.md works as written: its two
/// configuration blocks (paths and ports replaced by this test's) in front
/// of a Redis that requires client certificates, and each `redis-cli` line
/// gives the output its comment states.
#[test]
fn docs_tls_section_works_as_written() {
    let page = include_str!("../../docs/security.md");
    let section = page
        .split("\n## TLS\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a TLS section");
    let blocks: Vec<&str> = section
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(blocks.len(), 2, "client side and upstream side");
    let pki = Pki::new();
    let redis = tls_redis(&pki, true);
    let tls_port = free_port();
    let dir = format!("{}/", pki.dir.display());
    let toml = (blocks[0].to_string() + blocks[1])
        .replace("/etc/ackproxy/tls/", &dir)
        .replace("127.0.0.1:6381", &format!("127.0.0.1:{tls_port}"));
    // The harness gives the plain listener and the upstream on its command
    // line, which takes precedence over the file.
    let proxy = Proxy::start_with_config(redis.port, &toml, &[]);
    let lines: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with("redis-cli "))
        .collect();
    assert!(lines.len() >= 3, "{lines:?}");
    for line in lines {
        let (cmd, comment) = line.split_once("   # ").expect("an expected output");
        let want = comment.split(" — ").next().unwrap().trim();
        let cmd = cmd
            .replace("/etc/ackproxy/tls/", &dir)
            .replace("-p 6381", &format!("-p {tls_port}"))
            .replace("-p 6380", &format!("-p {}", proxy.port));
        let out = Command::new("sh").args(["-c", &cmd]).output().unwrap();
        assert_eq!(cli_out(&out), want, "{cmd}");
    }
}

/// Idle clients stay cheap with TLS configured: a plain one costs about
/// what it did before TLS existed (4.1–4.3 kB then; 5.0 kB since request
/// latency timing and the client's address for its log lines; 6.6 kB in
/// release since the proxy keeps its own table of clients for CLIENT LIST,
/// INFO and KILL: addresses, last command, metadata; a read buffer
/// kept while waiting once made it 9 kB, and a TLS handshake's state inside
/// every client's task 5.1 kB more), and a TLS one about 10 kB. Each kind is measured on a
/// proxy of its own, so that memory one frees cannot hide the other's.
#[test]
fn idle_clients_cost_little() {
    let pki = Pki::new();
    let redis = Redis::start();
    let start = || {
        let tls_port = free_port();
        let proxy = Proxy::start_with_config(redis.port, &pki.listener_toml(tls_port, "no"), &[]);
        // Warm up: the shared connection, the allocator's first arenas.
        assert_eq!(proxy.client().cmd(&["PING"]), Value::Simple("PONG".into()));
        (proxy, tls_port)
    };
    let per_client = |proxy: &Proxy, n: usize, before: u64| {
        (rss_kb(proxy.pid()) as f64 - before as f64) / n as f64
    };

    let (proxy, _) = start();
    let before = rss_kb(proxy.pid());
    let plain = open_pinged(proxy.port, 3000, 500, None);
    let plain_kb = per_client(&proxy, plain.len(), before);
    println!("{plain_kb:.1} kB per idle plain client");
    assert!(plain_kb < 7.5, "{plain_kb:.1} kB per idle plain client");

    let (proxy, tls_port) = start();
    let before = rss_kb(proxy.pid());
    let n = 300;
    let _held = runtime().block_on(async {
        let config = client_config(&pki, None);
        let mut held = Vec::new();
        for _ in 0..n {
            let mut c = TlsClient::connect(tls_port, config.clone()).await.unwrap();
            assert_eq!(
                c.cmd(&["PING"]).await.unwrap(),
                Value::Simple("PONG".into())
            );
            held.push(c);
        }
        held
    });
    let tls_kb = per_client(&proxy, n, before);
    println!("{tls_kb:.1} kB per idle TLS client");
    assert!(tls_kb < 16.0, "{tls_kb:.1} kB per idle TLS client");
}

#[test]
fn a_refused_client_certificate_is_logged_with_the_client_address() {
    let pki = Pki::new();
    let redis = Redis::start();
    let tls_port = free_port();
    let dir = std::env::temp_dir();
    let config = dir.join(format!("ackproxy-tls-log-{tls_port}.toml"));
    std::fs::write(&config, pki.listener_toml(tls_port, "yes")).unwrap();
    let log = dir.join(format!("ackproxy-tls-log-{tls_port}.txt"));
    let _proxy = Proxy::start_logged(redis.port, &config, &log);
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    // A client that connects and goes away without a word is no refusal.
    drop(std::net::TcpStream::connect(("127.0.0.1", tls_port)).unwrap());
    for (cert, why) in [
        (Some("rogue"), "UnknownIssuer"),
        (None, "peer sent no certificate"),
    ] {
        let addr = runtime().block_on(async {
            let mut c = TlsClient::connect(tls_port, client_config(&pki, cert))
                .await
                .unwrap();
            let addr = c.stream.get_ref().0.local_addr().unwrap();
            assert!(c.cmd(&["PING"]).await.is_err(), "{cert:?} was let in");
            addr
        });
        wait_until("the refusal in the log", || {
            read_log().contains(&format!("client={addr}"))
        });
        let text = read_log();
        let line = text
            .lines()
            .find(|l| l.contains(&format!("client={addr}")))
            .unwrap();
        assert!(
            line.contains("WARN") && line.contains("TLS handshake refused") && line.contains(why),
            "{cert:?}: {line}"
        );
    }
    let text = read_log();
    assert_eq!(text.matches("TLS handshake").count(), 2, "{text}");
    let _ = std::fs::remove_file(&config);
    let _ = std::fs::remove_file(&log);
}

//! Certificates made for the TLS tests: a CA, a server certificate for `localhost` and
//! `127.0.0.1`, and a client certificate, all signed by the CA, written as PEM files to a
//! directory of their own (removed on drop).

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

pub use super::redis_server::TlsFiles;

impl TlsFiles {
    /// A new CA with a server and a client certificate, in a fresh directory.
    pub fn new() -> Self {
        let dir = crate::support::redis_server::scratch_dir("tls");
        std::fs::create_dir_all(&dir).expect("create a directory for the certificates");

        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "tollgate test CA");
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("the CA certificate");
        let issuer = Issuer::from_params(&ca, &ca_key);

        let leaf = |names: Vec<String>| {
            let params = CertificateParams::new(names).expect("certificate parameters");
            let key = KeyPair::generate().expect("a key");
            let cert = params
                .signed_by(&key, &issuer)
                .expect("a signed certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
        let (client_cert, client_key) = leaf(vec!["tollgate-client".into()]);

        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write a PEM file");
            path
        };
        Self {
            ca_cert: write("ca.pem", &ca_cert.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            dir,
        }
    }
}

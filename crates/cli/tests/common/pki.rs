//! Certificates for the TLS tests, generated at test time (rcgen): CAs, server
//! certificates for 127.0.0.1 and client certificates with a chosen Common Name, written
//! as PEM files (keys mode 0600) into a temp dir.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate and key on disk.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The certificate in DER, to compare with what a server presents.
    pub der: Vec<u8>,
}

impl CertFiles {
    pub fn cert_arg(&self) -> String {
        self.cert.display().to_string()
    }

    pub fn key_arg(&self) -> String {
        self.key.display().to_string()
    }

    /// `serve`'s flags for TLS with this certificate, and client certificates signed by
    /// `client_ca` required if it is given.
    pub fn serve_args(&self, client_ca: Option<&Ca>) -> Vec<String> {
        let mut args = vec![
            "--tls-cert".to_owned(),
            self.cert_arg(),
            "--tls-key".to_owned(),
            self.key_arg(),
        ];
        if let Some(client_ca) = client_ca {
            args.extend(["--tls-client-ca".to_owned(), client_ca.cert_arg()]);
        }
        args
    }
}

/// A certificate authority whose certificate is in `cert_file`.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    pub cert_file: PathBuf,
    dir: PathBuf,
}

fn write_key(path: &Path, pem: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, pem).expect("write key");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
}

impl Ca {
    /// A new CA named `name`, its certificate written to `dir/<name>-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("{name} test CA"));
        params.distinguished_name = dn;
        let key = KeyPair::generate().expect("CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("CA certificate");
        let cert_file = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&cert_file, issuer.pem()).expect("write CA");
        Ca {
            issuer,
            cert_file,
            dir: dir.to_owned(),
        }
    }

    pub fn cert_arg(&self) -> String {
        self.cert_file.display().to_string()
    }

    fn issue(
        &self,
        file: &str,
        sans: &[&str],
        cn: &str,
        usages: &[ExtendedKeyUsagePurpose],
    ) -> CertFiles {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.extended_key_usages = usages.to_vec();
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let files = CertFiles {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&files.cert, cert.pem()).expect("write cert");
        write_key(&files.key, &key.serialize_pem());
        files
    }

    /// A server certificate for 127.0.0.1 and localhost, as `dir/<file>.pem` and `.key`.
    pub fn server_cert(&self, file: &str) -> CertFiles {
        self.issue(
            file,
            &["127.0.0.1", "localhost"],
            "palisade test server",
            &[ExtendedKeyUsagePurpose::ServerAuth],
        )
    }

    /// A certificate for an etcd member on 127.0.0.1: etcd's gateway dials the member's
    /// own client port with it, so it is also a client certificate.
    pub fn etcd_member_cert(&self, file: &str) -> CertFiles {
        self.issue(
            file,
            &["127.0.0.1", "localhost"],
            "etcd test member",
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    /// A client certificate whose subject Common Name is `cn`.
    pub fn client_cert(&self, file: &str, cn: &str) -> CertFiles {
        self.issue(file, &[], cn, &[ExtendedKeyUsagePurpose::ClientAuth])
    }
}

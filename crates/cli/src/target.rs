//! Which server a client command talks to, and how: the flags every client command takes
//! (`lock`, `kv`, `fence`, `token`, `keys`), each also settable by an environment variable.

use std::path::PathBuf;

use clap::Args;

use palisade_client::Deadlines;

use crate::exit::{client_failure, Exit, Failure};

/// Which server a client command talks to, and how it connects.
#[derive(Debug, Args)]
pub struct Target {
    /// Base URL of the Palisade server (http:// or https://).
    #[arg(
        long,
        env = "PALISADE_SERVER",
        default_value = "http://127.0.0.1:7700",
        global = true
    )]
    pub server: String,
    #[command(flatten)]
    pub connection: Connection,
}

/// How a client connects: the bearer key and the TLS files.
#[derive(Debug, Args)]
pub struct Connection {
    /// File holding the bearer key sent as `Authorization: Bearer <key>` (mode 0600: a
    /// file group or others may read is refused). Instead of a file, the key itself can be
    /// given in the environment variable PALISADE_KEY; this flag wins if both are set.
    #[arg(long, env = "PALISADE_KEY_FILE", global = true, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Trust only the CA certificates in this PEM file for an https:// server (default:
    /// the system's roots).
    #[arg(long, env = "PALISADE_CA_FILE", global = true, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for a server that requires mutual TLS; needs --client-key.
    #[arg(
        long,
        env = "PALISADE_CLIENT_CERT",
        global = true,
        value_name = "FILE",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// Private key (PEM) of --client-cert.
    #[arg(
        long,
        env = "PALISADE_CLIENT_KEY",
        global = true,
        value_name = "FILE",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
    /// For commands that hold a lease (`lock run`): when the client gives the lease up if
    /// no renewal has succeeded, as a fraction of the TTL after the last confirmed renewal
    /// was sent (more than 1/3, at most 1 - --clock-drift; default 2/3).
    #[arg(long, global = true, value_name = "FRACTION", default_value_t = Deadlines::DEFAULT_RENEW_DEADLINE, hide_default_value = true)]
    pub renew_deadline: f64,
    /// For commands that hold a lease: the largest clock-rate difference assumed between
    /// this host and the server, as a fraction (0.01 = 1 %). A lease's safe deadline is its
    /// TTL less this share, counted from the last confirmed renewal's send.
    #[arg(long, global = true, value_name = "FRACTION", default_value_t = Deadlines::DEFAULT_CLOCK_DRIFT)]
    pub clock_drift: f64,
}

/// A client and the URL it talks to, for error messages.
pub struct Connected {
    pub client: palisade_client::Client,
    pub server: String,
}

impl Connected {
    /// Turns a client error into the command's failure (exit code and one line).
    pub fn fail(&self, err: palisade_client::Error) -> Failure {
        client_failure(err, &self.server)
    }
}

impl Target {
    /// A client with these settings (files are read here, before any request).
    pub fn connect(self) -> Result<Connected, Failure> {
        self.connection.connect(&self.server)
    }
}

impl Connection {
    /// A client of `server` with these settings (files are read here, before any
    /// request).
    pub fn connect(self, server: &str) -> Result<Connected, Failure> {
        let base = server.trim_end_matches('/').to_owned();
        let deadlines = Deadlines::new(self.renew_deadline, self.clock_drift).map_err(|e| {
            Failure::new(
                Exit::Usage,
                format!("--renew-deadline / --clock-drift: {e}"),
            )
        })?;
        let mut builder = palisade_client::Client::builder(server).deadlines(deadlines);
        if let Some(ca) = self.ca_file {
            builder = builder.ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (self.client_cert, self.client_key) {
            builder = builder.client_cert(cert, key);
        }
        builder = match (self.key_file, std::env::var("PALISADE_KEY")) {
            (Some(file), _) => builder.bearer_key_file(file),
            (None, Ok(key)) => builder.bearer_key(key),
            (None, Err(_)) => builder,
        };
        match builder.build() {
            Ok(client) => Ok(Connected {
                client,
                server: base,
            }),
            // Settings refused before any request: name the flag, not a server's code.
            Err(palisade_client::Error::BadRequest(why)) => Err(Failure::new(
                Exit::Usage,
                format!("--server (PALISADE_SERVER): {why}"),
            )),
            Err(e) => Err(client_failure(e, &base)),
        }
    }
}

//! TLS for the remote mount (docs/SPEC.md §13, docs/PROTOCOL-NOTES.md R1): TLS 1.3 only, with
//! `rustls` and its `ring` provider. The daemon makes a self-signed certificate at mount
//! ([`Identity::generate`]; ECDSA P-256, `rcgen`) and keeps it and its key 0600 in
//! `.smithfs-state/` (the store's state directory, which no smith can reach); a client accepts
//! exactly the certificate whose SHA-256 its ticket pins ([`client_config`]), so no CA is
//! involved and a stolen ticket of another mount is useless.

use std::ffi::CString;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{ring as provider, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::keys::PIN_LEN;
use crate::backing;

/// The name the certificate is made for and every client asks for (no DNS is involved: the
/// certificate is pinned).
pub const SERVER_NAME: &str = "smithfs";
/// The certificate's file in `.smithfs-state/` (DER).
pub const CERT_FILE: &str = "listener-cert.der";
/// Its private key's file in `.smithfs-state/` (PKCS#8 DER, 0600).
pub const KEY_FILE: &str = "listener-key.der";

/// The listener's certificate and key.
pub struct Identity {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("pin", &super::keys::hex(&self.pin()))
            .finish_non_exhaustive()
    }
}

/// `ring`'s provider (the brief's choice: no aws-lc, no cmake). rustls 0.23.48 marks it
/// deprecated because it has no post-quantum key exchange; X25519 and P-256 it has
/// (docs/PROTOCOL-NOTES.md R1).
#[allow(deprecated)]
fn the_provider() -> Arc<CryptoProvider> {
    Arc::new(provider::default_provider())
}

impl Identity {
    /// A new self-signed certificate for [`SERVER_NAME`] with a new ECDSA P-256 key.
    ///
    /// # Errors
    /// One sentence from `rcgen`.
    pub fn generate() -> Result<Identity, String> {
        let key = rcgen::KeyPair::generate().map_err(|e| format!("cannot make a key: {e}"))?;
        let params = rcgen::CertificateParams::new(vec![SERVER_NAME.to_string()])
            .map_err(|e| format!("cannot make a certificate: {e}"))?;
        let cert = params
            .self_signed(&key)
            .map_err(|e| format!("cannot sign the certificate: {e}"))?;
        Ok(Identity {
            cert: cert.der().clone(),
            key: key.serialize_der(),
        })
    }

    /// Write the certificate and the key into `state` (`.smithfs-state/`), each 0600 and
    /// replaced atomically.
    ///
    /// # Errors
    /// The write's error.
    pub fn store(&self, state: BorrowedFd<'_>) -> Result<(), String> {
        for (name, data) in [(CERT_FILE, self.cert.as_ref()), (KEY_FILE, &self.key[..])] {
            let c = CString::new(name).map_err(|e| e.to_string())?;
            backing::write_replace(state, &c, data, 0o600)
                .map_err(|e| format!("cannot write .smithfs-state/{name}: {e}"))?;
        }
        Ok(())
    }

    /// SHA-256 of the certificate's DER: what a ticket pins.
    pub fn pin(&self) -> [u8; PIN_LEN] {
        pin_of(self.cert.as_ref())
    }

    /// The server's TLS configuration (TLS 1.3, no client certificate: a client proves its
    /// run with the run's secret inside the channel).
    ///
    /// # Errors
    /// `rustls` refused the key.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, String> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
        let cfg = rustls::ServerConfig::builder_with_provider(the_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], key)
            .map_err(|e| format!("TLS refused the listener's key: {e}"))?;
        Ok(Arc::new(cfg))
    }
}

/// SHA-256 of `der`.
pub fn pin_of(der: &[u8]) -> [u8; PIN_LEN] {
    let d = ring::digest::digest(&ring::digest::SHA256, der);
    let mut out = [0u8; PIN_LEN];
    out.copy_from_slice(d.as_ref());
    out
}

/// Accepts exactly the certificate whose SHA-256 is `pin`, and checks the handshake's
/// signatures with its key as any verifier does.
#[derive(Debug)]
struct Pinned {
    pin: [u8; PIN_LEN],
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if pin_of(end_entity.as_ref()) == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // TLS 1.3 only: never reached.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls13RequiredForQuic,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client's TLS configuration that trusts only the certificate `pin` names.
///
/// # Errors
/// `rustls` refused the configuration.
pub fn client_config(pin: [u8; PIN_LEN]) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = the_provider();
    let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned { pin, provider }))
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The server name every client asks for.
pub fn server_name() -> ServerName<'static> {
    ServerName::DnsName(
        rustls::pki_types::DnsName::try_from(SERVER_NAME)
            .expect("a constant, valid DNS name")
            .to_owned(),
    )
}

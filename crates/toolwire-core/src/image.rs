//! Images in messages: a message holds a [`BlobRef`] (media type, SHA-256
//! of the bytes, length), never the bytes; the store keeps each image once
//! under its hash. What an image is (PNG, JPEG, GIF, WebP) is read from
//! its first bytes, never from a name or a declared type, and an image over
//! [`MAX_IMAGE_BYTES`] is refused before it is stored.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest image accepted, decoded: Anthropic's limit per image.
pub const MAX_IMAGE_BYTES: usize = 5 * 1024 * 1024;

/// Stored bytes a message refers to, by the SHA-256 of the bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlobRef {
    /// What the bytes are (`image/png`, …).
    pub media_type: String,
    /// The SHA-256 of the bytes, 64 lowercase hex digits: the store's key.
    pub sha256: String,
    /// The length of the bytes.
    pub bytes_len: u64,
}

impl BlobRef {
    /// The reference to `bytes` of type `media_type`.
    pub fn of(media_type: &str, bytes: &[u8]) -> BlobRef {
        BlobRef {
            media_type: media_type.to_owned(),
            sha256: sha256_hex(bytes),
            bytes_len: bytes.len() as u64,
        }
    }

    /// A one-line mention for places that show no image (a terminal, a
    /// text-only client): `[image: image/png, 12 KB, sha256 ab12cd34…]`.
    pub fn mention(&self) -> String {
        format!("[image: {}]", self.describe())
    }

    /// What a model that cannot see the image is told in its place.
    pub fn placeholder(&self, why: &str) -> String {
        format!("[image: {}: {why}]", self.describe())
    }

    fn describe(&self) -> String {
        let short = self.sha256.get(..12).unwrap_or(&self.sha256);
        format!(
            "{}, {}, sha256 {short}…",
            self.media_type,
            human_size(self.bytes_len)
        )
    }
}

/// What a model without vision is told about an image.
pub const CANNOT_SEE_IMAGES: &str = "this model cannot see images";

/// Why bytes are not accepted as an image.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Over [`MAX_IMAGE_BYTES`].
    #[error("the image is {} ({bytes} bytes), over the limit of {} ({limit} bytes)", human_size(*bytes as u64), human_size(*limit as u64))]
    TooLarge {
        /// Its size, decoded.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// Not a PNG, JPEG, GIF or WebP (by its first bytes).
    #[error("not an image toolwire accepts (PNG, JPEG, GIF or WebP, by its first bytes){}", declared.as_ref().map(|d| format!("; it was declared as {d}")).unwrap_or_default())]
    NotAnImage {
        /// The type the sender claimed, if any.
        declared: Option<String>,
    },
}

/// The media type of `bytes` if they are an image toolwire accepts,
/// judged by their magic bytes.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The media type of `bytes` if they are an image within the limit;
/// `declared` (what the sender said it is) only words the error.
pub fn check_image(bytes: &[u8], declared: Option<&str>) -> Result<&'static str, ImageError> {
    if bytes.len() > MAX_IMAGE_BYTES {
        return Err(ImageError::TooLarge {
            bytes: bytes.len(),
            limit: MAX_IMAGE_BYTES,
        });
    }
    sniff(bytes).ok_or_else(|| ImageError::NotAnImage {
        declared: declared.map(str::to_owned),
    })
}

/// The SHA-256 of `bytes` as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let digest = Sha256::digest(bytes);
    let mut s = String::with_capacity(64);
    for b in digest {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Whether `s` is a blob key: 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `512 B`, `12 KB`, `4.8 MB`.
pub fn human_size(bytes: u64) -> String {
    const KB: u64 = 1024;
    const MB: u64 = 1024 * 1024;
    if bytes < KB {
        format!("{bytes} B")
    } else if bytes < MB {
        format!("{} KB", bytes.div_ceil(KB))
    } else {
        format!("{:.1} MB", bytes as f64 / MB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_told_by_their_first_bytes() {
        assert_eq!(sniff(b"\x89PNG\r\n\x1a\n rest"), Some("image/png"));
        assert_eq!(sniff(&[0xff, 0xd8, 0xff, 0xe0]), Some("image/jpeg"));
        assert_eq!(sniff(b"GIF89a..."), Some("image/gif"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(sniff(b"\x89PN"), None);
        assert_eq!(sniff(b"<svg/>"), None);
    }

    #[test]
    fn a_large_image_is_refused_naming_size_and_limit() {
        let mut big = b"\x89PNG\r\n\x1a\n".to_vec();
        big.resize(MAX_IMAGE_BYTES + 1, 0);
        let err = check_image(&big, None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the image is 5.0 MB (5242881 bytes), over the limit of 5.0 MB (5242880 bytes)"
        );
        let err = check_image(b"hello", Some("image/png")).unwrap_err();
        assert!(err.to_string().contains("declared as image/png"), "{err}");
    }

    #[test]
    fn a_reference_names_its_hash_and_size() {
        let r = BlobRef::of("image/png", b"abc");
        assert_eq!(
            r.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(is_sha256_hex(&r.sha256));
        assert!(!is_sha256_hex("../etc/passwd"));
        assert!(!is_sha256_hex(&r.sha256.to_uppercase()));
        assert_eq!(
            r.placeholder(CANNOT_SEE_IMAGES),
            "[image: image/png, 3 B, sha256 ba7816bf8f01…: this model cannot see images]"
        );
        assert_eq!(human_size(12 * 1024 + 1), "13 KB");
    }
}

//! The images of a request: their bytes, resolved by the engine from the
//! store, and what a model is shown for each (the image, or a placeholder
//! naming what it cannot see).

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use toolwire_core::BlobRef;
use toolwire_core::image::CANNOT_SEE_IMAGES;

/// Why an image a model could see is not shown: the engine found no
/// bytes under its hash.
const MISSING: &str = "its bytes are missing from the store";

/// The images a request's path refers to.
#[derive(Debug, Clone, Default)]
pub struct RequestImages {
    /// Whether the model sees images; without vision every image is a
    /// text placeholder.
    pub vision: bool,
    /// The bytes of each image, by SHA-256 (see [`BlobRef::sha256`]).
    pub bytes: HashMap<String, Arc<[u8]>>,
}

/// How one image goes to the model.
pub(crate) enum Shown {
    /// The image itself: its media type and its bytes in base64.
    Image { media_type: String, data: String },
    /// Text in its place.
    Placeholder(String),
}

impl RequestImages {
    /// What the model is shown for `image`.
    pub(crate) fn show(&self, image: &BlobRef) -> Shown {
        match (self.vision, self.bytes.get(&image.sha256)) {
            (true, Some(bytes)) => Shown::Image {
                media_type: image.media_type.clone(),
                data: STANDARD.encode(bytes),
            },
            _ => Shown::Placeholder(self.placeholder(image).unwrap_or_default()),
        }
    }

    /// The text shown in place of `image`, if the model is not shown it.
    fn placeholder(&self, image: &BlobRef) -> Option<String> {
        if !self.vision {
            Some(image.placeholder(CANNOT_SEE_IMAGES))
        } else if !self.bytes.contains_key(&image.sha256) {
            Some(image.placeholder(MISSING))
        } else {
            None
        }
    }

    /// The placeholders of `images` a model cannot see, one per line, to
    /// follow a text; empty when the model sees them all.
    pub(crate) fn placeholders(&self, images: &[BlobRef]) -> String {
        let mut s = String::new();
        for image in images {
            if let Some(text) = self.placeholder(image) {
                s.push('\n');
                s.push_str(&text);
            }
        }
        s
    }
}

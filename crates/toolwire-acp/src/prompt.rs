//! A `session/prompt`'s blocks as the user message the engine stores:
//! text, resources (embedded ones by their text; links to files read
//! through the editor's `fs/read_text_file` when it offers it, otherwise
//! named), and images, each stored once as a blob (checked, and refused
//! over the size limit) and sent to the model in its provider's format.
//! An image for a model that cannot see is refused with a JSON-RPC error
//! naming the model, never dropped.

use agent_client_protocol::v1::schema as acp;
use base64::Engine as _;
use toolwire_core::ContentBlock;
use toolwire_engine::{Engine, EngineError};

use crate::errors::{internal, invalid_params};
use crate::state::Session;

/// The user message of `blocks`: one text block (the prompt's text parts,
/// a paragraph each), then its images in order; and the text alone.
pub(crate) async fn content(
    engine: &Engine,
    session: &Session,
    blocks: &[acp::ContentBlock],
) -> Result<(Vec<ContentBlock>, String), agent_client_protocol::Error> {
    let mut parts: Vec<String> = Vec::new();
    let mut images = Vec::new();
    for (n, block) in blocks.iter().enumerate() {
        match block {
            acp::ContentBlock::Text(t) => parts.push(t.text.clone()),
            acp::ContentBlock::ResourceLink(link) => parts.push(linked(session, link).await),
            acp::ContentBlock::Resource(embedded) => match &embedded.resource {
                acp::EmbeddedResourceResource::TextResourceContents(r) => {
                    parts.push(format!("{}:\n{}", r.uri, r.text));
                }
                acp::EmbeddedResourceResource::BlobResourceContents(r)
                    if r.mime_type
                        .as_deref()
                        .is_some_and(|m| m.starts_with("image/")) =>
                {
                    let what = format!("prompt block {n} (resource {})", r.uri);
                    images.push(image(engine, &what, &r.blob, r.mime_type.as_deref()).await?);
                }
                acp::EmbeddedResourceResource::BlobResourceContents(r) => {
                    return Err(invalid_params(format!(
                        "prompt block {n}: resource {} is binary ({}); only text resources and \
                         images are taken",
                        r.uri,
                        r.mime_type.as_deref().unwrap_or("no type")
                    )));
                }
                _ => {
                    return Err(invalid_params(format!(
                        "prompt block {n}: a resource of a kind this agent does not know"
                    )));
                }
            },
            acp::ContentBlock::Image(img) => {
                let data = match (&img.data, &img.uri) {
                    (data, _) if !data.is_empty() => data.clone(),
                    (_, Some(uri)) => data_uri(uri).map_err(|why| {
                        invalid_params(format!("prompt block {n} (image): {why}"))
                    })?,
                    _ => {
                        return Err(invalid_params(format!("prompt block {n} (image): no data")));
                    }
                };
                let what = format!("prompt block {n} (image)");
                images.push(image(engine, &what, &data, Some(&img.mime_type)).await?);
            }
            acp::ContentBlock::Audio(_) => {
                return Err(invalid_params(format!(
                    "prompt block {n}: audio is not taken (promptCapabilities.audio is false)"
                )));
            }
            _ => {
                return Err(invalid_params(format!(
                    "prompt block {n}: a content block of a kind this agent does not know"
                )));
            }
        }
    }
    if !images.is_empty() {
        let model = engine
            .model_for(&session.turn_options())
            .map_err(internal)?;
        if !model.info.capabilities.vision {
            return Err(invalid_params(format!(
                "the prompt has {} image(s), and model `{}` cannot see images: choose a model \
                 with vision (the `model` config option) or send text",
                images.len(),
                model.info.name
            )));
        }
    }
    let text = parts.join("\n\n");
    let mut content = Vec::with_capacity(images.len() + 1);
    if !text.is_empty() {
        content.push(ContentBlock::Text { text: text.clone() });
    }
    content.extend(images.into_iter().map(ContentBlock::Image));
    Ok((content, text))
}

/// Whether a user message of `content` has images.
pub(crate) fn has_images(content: &[ContentBlock]) -> bool {
    content.iter().any(|b| matches!(b, ContentBlock::Image(_)))
}

/// A resource link as the model reads it: a file's text through the
/// editor when it offers reads, otherwise `@uri`.
async fn linked(session: &Session, link: &acp::ResourceLink) -> String {
    let named = format!("@{}", link.uri);
    let (Some(fs), Some(path)) = (
        session.edits.fs.as_ref().filter(|fs| fs.read),
        link.uri.strip_prefix("file://"),
    ) else {
        return named;
    };
    if link
        .mime_type
        .as_deref()
        .is_some_and(|m| !m.starts_with("text/"))
    {
        return named;
    }
    match fs.read_linked(std::path::Path::new(path)).await {
        Ok(text) => format!("{}:\n{text}", link.uri),
        Err(e) => {
            tracing::info!(uri = %link.uri, error = %e.message, "a linked file could not be read: named instead");
            named
        }
    }
}

/// Decodes and stores an image; `what` names it in the error.
async fn image(
    engine: &Engine,
    what: &str,
    base64: &str,
    declared: Option<&str>,
) -> Result<toolwire_core::BlobRef, agent_client_protocol::Error> {
    // Editors wrap long base64 lines.
    let compact: String = base64.split_ascii_whitespace().collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| invalid_params(format!("{what}: the data is not valid base64: {e}")))?;
    engine
        .put_image(&bytes, declared)
        .await
        .map_err(|e| match e {
            EngineError::Image(e) => invalid_params(format!("{what}: {e}")),
            e => internal(e),
        })
}

/// The base64 payload of a `data:<type>;base64,<data>` URI.
fn data_uri(uri: &str) -> Result<String, String> {
    let rest = uri
        .strip_prefix("data:")
        .ok_or_else(|| format!("no data, and its uri is not a data URI ({})", short(uri)))?;
    let (header, data) = rest
        .split_once(',')
        .ok_or_else(|| "malformed data URI: no `,` before the data".to_owned())?;
    if !header.ends_with(";base64") {
        return Err("malformed data URI: the data is not marked `;base64`".to_owned());
    }
    Ok(data.to_owned())
}

fn short(s: &str) -> String {
    let cut: String = s.chars().take(40).collect();
    if cut.len() < s.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// Bytes of `blob` as an ACP image block (a replayed prompt).
pub(crate) fn image_block(media_type: &str, bytes: &[u8]) -> acp::ContentBlock {
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    acp::ContentBlock::Image(acp::ImageContent::new(data, media_type.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::data_uri;

    #[test]
    fn data_uris_give_their_payload_or_say_what_is_wrong() {
        assert_eq!(
            data_uri("data:image/png;base64,AAAA").as_deref(),
            Ok("AAAA")
        );
        assert!(
            data_uri("data:image/png,AAAA")
                .unwrap_err()
                .contains(";base64")
        );
        assert!(
            data_uri("data:image/png;base64")
                .unwrap_err()
                .contains("`,`")
        );
        assert!(
            data_uri("https://x/y.png")
                .unwrap_err()
                .contains("not a data URI")
        );
    }
}

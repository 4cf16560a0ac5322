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

    /// Whether the model is shown `image` itself.
    pub(crate) fn visible(&self, image: &BlobRef) -> bool {
        self.placeholder(image).is_none()
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

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use toolwire_core::{ContentBlock, ConversationId, Message, Role, ToolCallId};

    use super::*;
    use crate::{anthropic, openai, xml_format};

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\nfake";

    /// A user message with an image, a call and its result with another.
    fn path() -> (Vec<Message>, BlobRef, BlobRef) {
        let c = ConversationId::new();
        let seen = BlobRef::of("image/png", PNG);
        let shot = BlobRef::of("image/jpeg", b"\xff\xd8\xffjpeg");
        let user = Message::new(
            c,
            None,
            Role::User,
            vec![
                ContentBlock::Text {
                    text: "what is this?".into(),
                },
                ContentBlock::Image(seen.clone()),
            ],
        );
        let call = Message::new(
            c,
            Some(user.id),
            Role::Assistant,
            vec![ContentBlock::ToolUse {
                id: ToolCallId("c1".into()),
                server: None,
                name: "screenshot".into(),
                arguments: json!({}),
            }],
        );
        let result = Message::new(
            c,
            Some(call.id),
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: ToolCallId("c1".into()),
                content: "taken".into(),
                is_error: false,
                images: vec![shot.clone()],
            }],
        );
        (vec![user, call, result], seen, shot)
    }

    fn seeing(refs: &[(&BlobRef, &[u8])]) -> RequestImages {
        RequestImages {
            vision: true,
            bytes: refs
                .iter()
                .map(|(r, b)| (r.sha256.clone(), Arc::from(*b)))
                .collect(),
        }
    }

    fn to_json(messages: &impl serde::Serialize) -> Value {
        serde_json::to_value(messages).expect("messages encode")
    }

    fn b64(bytes: &[u8]) -> String {
        STANDARD.encode(bytes)
    }

    #[test]
    fn openai_gets_image_url_parts_and_tool_images_in_a_user_message() {
        let (path, seen, shot) = path();
        let shown = seeing(&[(&seen, PNG), (&shot, b"\xff\xd8\xffjpeg")]);
        let messages = openai::messages("sys", &path, &shown);
        assert_eq!(
            to_json(&messages),
            json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(PNG))}},
                ]},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "taken"},
                {"role": "user", "content": [
                    {"type": "text", "text": "The image tool call c1 returned:"},
                    {"type": "image_url", "image_url": {"url": format!("data:image/jpeg;base64,{}", b64(b"\xff\xd8\xffjpeg"))}},
                ]},
            ])
        );
    }

    #[test]
    fn anthropic_gets_image_blocks_also_inside_tool_results() {
        let (path, seen, shot) = path();
        let shown = seeing(&[(&seen, PNG), (&shot, b"\xff\xd8\xffjpeg")]);
        let messages = anthropic::messages(&path, &shown);
        assert_eq!(
            to_json(&messages),
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "c1", "name": "screenshot", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "is_error": false, "content": [
                        {"type": "text", "text": "taken"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(b"\xff\xd8\xffjpeg")}},
                    ]},
                ]},
            ])
        );
    }

    #[test]
    fn a_model_without_vision_reads_placeholders() {
        let (path, seen, shot) = path();
        let blind = RequestImages {
            vision: false,
            bytes: HashMap::new(),
        };
        let placeholder = |r: &BlobRef| r.placeholder(CANNOT_SEE_IMAGES);
        let body = to_json(&openai::messages("", &path, &blind));
        assert_eq!(
            body[0]["content"],
            json!([
                {"type": "text", "text": "what is this?"},
                {"type": "text", "text": placeholder(&seen)},
            ])
        );
        assert_eq!(
            body[2]["content"],
            json!(format!("taken\n{}", placeholder(&shot)))
        );
        assert_eq!(body.as_array().map(Vec::len), Some(3), "no image message");
        assert!(!body.to_string().contains("image_url"));

        let body = to_json(&anthropic::messages(&path, &blind));
        assert_eq!(
            body[0]["content"][1],
            json!({"type": "text", "text": placeholder(&seen)})
        );
        assert_eq!(
            body[2]["content"][0]["content"],
            json!([
                {"type": "text", "text": "taken"},
                {"type": "text", "text": placeholder(&shot)},
            ])
        );
        assert!(placeholder(&seen).contains("this model cannot see images"));
        assert!(!body.to_string().contains("base64"));
    }

    #[test]
    fn an_image_missing_from_the_store_is_named() {
        let (one, seen, _) = path();
        let shown = seeing(&[(&seen, PNG)]);
        let body = to_json(&anthropic::messages(&one, &shown));
        let text = body[2]["content"][0]["content"][1]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains("missing from the store"), "{body}");

        // OpenAI: of a result's two images, the one kept is sent, the
        // missing one named in the result's text.
        let (mut two, seen, shot) = path();
        if let ContentBlock::ToolResult { images, .. } = &mut two[2].content[0] {
            images.insert(0, seen.clone());
        }
        let body = to_json(&openai::messages("", &two, &shown));
        let result = body[2]["content"].as_str().unwrap_or_default();
        assert_eq!(
            result,
            format!(
                "taken\n{}",
                shot.placeholder("its bytes are missing from the store")
            )
        );
        assert_eq!(
            body[3]["content"],
            json!([
                {"type": "text", "text": "The image tool call c1 returned:"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(PNG))}},
            ])
        );
    }

    #[test]
    fn the_xml_protocol_sends_tool_images_after_the_results() {
        let (path, seen, shot) = path();
        let shown = seeing(&[(&seen, PNG), (&shot, b"\xff\xd8\xffjpeg")]);
        let text_path = xml_format::as_text_protocol(&path);
        let body = to_json(&openai::messages("", &text_path, &shown));
        let last = &body[2]["content"];
        assert_eq!(last[0]["type"], "text");
        assert!(
            last[0]["text"]
                .as_str()
                .unwrap_or_default()
                .contains("<tool_result call_id=\"c1\"")
        );
        assert_eq!(last[1]["type"], "image_url");
    }

    #[test]
    fn paths_without_images_keep_string_content() {
        let c = ConversationId::new();
        let user = Message::new(
            c,
            None,
            Role::User,
            vec![ContentBlock::Text { text: "hi".into() }],
        );
        let shown = RequestImages::default();
        assert_eq!(
            to_json(&openai::messages("", std::slice::from_ref(&user), &shown)),
            json!([{"role": "user", "content": "hi"}])
        );
    }
}

//! A fast way to read stored content lists, for the shapes serde_json
//! writes.
//!
//! `ContentBlock` is an internally tagged enum: serde reads each block by
//! buffering all its fields first (every string copied, every key kept),
//! then reading the variant from the buffer. On a tool loop's path that
//! buffering was most of the read. Here a block whose first key is its
//! `type` (as serde_json writes every block) is read in one pass, each field
//! straight into its place.
//!
//! [`blocks`] accepts only what the general way reads the same: anything it
//! does not expect (another key first, a duplicate, a missing field, a
//! value of another type, an escaped key) makes it give up, and the caller
//! reads the list the general way, which decides (and words any error).

use std::fmt;

use serde::Deserializer as _;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use toolwire_core::{BlobRef, ContentBlock, Priority, ToolCallId};

/// The content list in `json`, or `None` if it is not in a shape this
/// reader knows (the general way must then read it).
pub(crate) fn blocks(json: &[u8]) -> Option<Vec<ContentBlock>> {
    // Checked whole in one pass, the text is not checked again string by
    // string (which took more than the rest of the parsing of a short
    // string).
    let json = std::str::from_utf8(json).ok()?;
    let mut de = serde_json::Deserializer::from_str(json);
    let blocks = (&mut de).deserialize_seq(Blocks).ok()?;
    de.end().ok()?;
    Some(blocks)
}

/// Any error: the reader gives up, the message is never shown.
fn give_up<E: de::Error>() -> E {
    E::custom("not a shape the fast reader knows")
}

struct Blocks;

impl<'de> Visitor<'de> for Blocks {
    type Value = Vec<ContentBlock>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of content blocks")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        // Most messages hold one or two blocks.
        let mut blocks = Vec::with_capacity(2);
        while let Some(block) = seq.next_element_seed(Block)? {
            blocks.push(block);
        }
        Ok(blocks)
    }
}

struct Block;

impl<'de> DeserializeSeed<'de> for Block {
    type Value = ContentBlock;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<ContentBlock, D::Error> {
        d.deserialize_map(self)
    }
}

/// One field of a block, filled at most once.
struct Field<T>(Option<T>);

impl<T> Field<T> {
    fn set<'de, A: MapAccess<'de>>(&mut self, map: &mut A) -> Result<(), A::Error>
    where
        T: de::Deserialize<'de>,
    {
        if self.0.is_some() {
            return Err(give_up());
        }
        self.0 = Some(map.next_value()?);
        Ok(())
    }

    fn get<E: de::Error>(self) -> Result<T, E> {
        self.0.ok_or_else(give_up)
    }
}

impl<T> Default for Field<T> {
    fn default() -> Self {
        Field(None)
    }
}

impl<'de> Visitor<'de> for Block {
    type Value = ContentBlock;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a content block, its type first")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ContentBlock, A::Error> {
        // Keys are borrowed: an escaped key (which cannot be) gives up.
        if map.next_key::<&str>()? != Some("type") {
            return Err(give_up());
        }
        let kind: &str = map.next_value()?;
        // The general way ignores keys that are not the variant's, whatever
        // their value; `type` again is an error there.
        let mut text = Field::<String>::default();
        let block = match kind {
            "text" | "reasoning" => {
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        "text" => text.set(&mut map)?,
                        "type" => return Err(give_up()),
                        _ => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                let text = text.get()?;
                if kind == "text" {
                    ContentBlock::Text { text }
                } else {
                    ContentBlock::Reasoning { text }
                }
            }
            "tool_use" => {
                let (mut id, mut name) = (Field::<String>::default(), Field::default());
                let mut server = Field::<Option<String>>::default();
                let mut arguments = Field::<Value>::default();
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        "id" => id.set(&mut map)?,
                        "server" => server.set(&mut map)?,
                        "name" => name.set(&mut map)?,
                        "arguments" => arguments.set(&mut map)?,
                        "type" => return Err(give_up()),
                        _ => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                ContentBlock::ToolUse {
                    id: ToolCallId(id.get()?),
                    server: server.0.flatten(),
                    name: name.get()?,
                    arguments: arguments.get()?,
                }
            }
            "tool_result" => {
                let (mut id, mut content) = (Field::<String>::default(), Field::default());
                let mut is_error = Field::<bool>::default();
                let mut images = Field::<Vec<BlobRef>>::default();
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        "tool_use_id" => id.set(&mut map)?,
                        "content" => content.set(&mut map)?,
                        "is_error" => is_error.set(&mut map)?,
                        "images" => images.set(&mut map)?,
                        "type" => return Err(give_up()),
                        _ => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                ContentBlock::ToolResult {
                    tool_use_id: ToolCallId(id.get()?),
                    content: content.get()?,
                    is_error: is_error.0.unwrap_or_default(),
                    images: images.0.unwrap_or_default(),
                }
            }
            "image" => {
                let (mut media_type, mut sha256) = (Field::<String>::default(), Field::default());
                let mut bytes_len = Field::<u64>::default();
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        "media_type" => media_type.set(&mut map)?,
                        "sha256" => sha256.set(&mut map)?,
                        "bytes_len" => bytes_len.set(&mut map)?,
                        "type" => return Err(give_up()),
                        _ => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                ContentBlock::Image(BlobRef {
                    media_type: media_type.get()?,
                    sha256: sha256.get()?,
                    bytes_len: bytes_len.get()?,
                })
            }
            "notification" => {
                let mut source = Field::<String>::default();
                let mut priority = Field::<Priority>::default();
                while let Some(key) = map.next_key::<&str>()? {
                    match key {
                        "source" => source.set(&mut map)?,
                        "priority" => priority.set(&mut map)?,
                        "text" => text.set(&mut map)?,
                        "type" => return Err(give_up()),
                        _ => drop(map.next_value::<IgnoredAny>()?),
                    }
                }
                ContentBlock::Notification {
                    source: source.get()?,
                    priority: priority.0.unwrap_or_default(),
                    text: text.get()?,
                }
            }
            _ => return Err(give_up()),
        };
        Ok(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever the fast reader accepts, the general way reads the same.
    #[test]
    fn reads_as_the_general_way_does() {
        let cases = [
            r#"[{"type":"text","text":"plain"}]"#,
            r#"[{"type":"text","text":"a"},{"type":"reasoning","text":"b"}]"#,
            r#"[{"type":"text","text":"x","id":5,"extra":{"deep":[1,2]}}]"#,
            r#"[{"type":"text","text":"x","text":"y"}]"#,
            r#"[{"type":"text","text":"x","type":"text"}]"#,
            r#"[{"type":"text"}]"#,
            r#"[{"type":"text","text":null}]"#,
            r#"[{"text":"tag last","type":"text"}]"#,
            r#"[{"type":"tool_use","id":"c1","name":"read","arguments":{"path":"a.rs","limit":200}}]"#,
            r#"[{"type":"tool_use","id":"c1","server":"fs","name":"read","arguments":{"b":1,"a":[true,null,1.5,-3,"s"]}}]"#,
            r#"[{"type":"tool_use","id":"c1","server":null,"name":"read","arguments":null}]"#,
            r#"[{"type":"tool_use","id":"c1","name":"read","arguments":{"k":1,"k":2,"j":3}}]"#,
            r#"[{"type":"tool_use","id":"c1","name":"read"}]"#,
            r#"[{"type":"tool_use","id":7,"name":"read","arguments":{}}]"#,
            r#"[{"type":"tool_use","id":"c1","name":"read","arguments":{},"server":5}]"#,
            r#"[{"type":"tool_use","id":"c1","name":"read","arguments":18446744073709551615}]"#,
            r#"[{"type":"tool_use","id":"c1","name":"read","arguments":1e400}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"fn f() {}\n\t\"q\" é \u00e9 😀","is_error":false}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"out"}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"out","is_error":true}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"out","is_error":null}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"out","is_error":1}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"out","images":[{"media_type":"image/png","sha256":"ab","bytes_len":3}]}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"out","images":null}]"#,
            r#"[{"type":"tool_result","tool_use_id":"c1","content":"out","images":[{"media_type":"image/png"}]}]"#,
            r#"[{"type":"image","media_type":"image/png","sha256":"ab","bytes_len":3}]"#,
            r#"[{"type":"image","media_type":"image/png","sha256":"ab","bytes_len":-3}]"#,
            r#"[{"type":"image","media_type":"image/png","sha256":"ab"}]"#,
            r#"[{"type":"image","media_type":"image/png","sha256":"ab","bytes_len":3,"extra":1}]"#,
            r#"[{"type":"notification","source":"ci","text":"red"}]"#,
            r#"[{"type":"notification","source":"ci","priority":"high","text":"red"}]"#,
            r#"[{"type":"notification","source":"ci","priority":"urgent","text":"red"}]"#,
            r#"[{"type":"unknown","text":"?"}]"#,
            r#"[{"type":5}]"#,
            r#"[{"t\u0079pe":"text","text":"escaped key"}]"#,
            r#"[{"type":"te\u0078t","text":"escaped type"}]"#,
            r#" [ { "type" : "text" , "text" : "spaced" } ] "#,
            r#"[]"#,
            r#"[{"type":"text","text":"a"},]"#,
            r#"[{"type":"text","text":"a"}] trailing"#,
            r#"[{"type":"text","text":"lone \ud800"}]"#,
            r#"[{"type":"text","text":"unclosed}]"#,
            r#"{"not":"blocks"}"#,
            r#"[1]"#,
            "",
        ];
        for json in cases {
            let general = serde_json::from_slice::<Vec<ContentBlock>>(json.as_bytes());
            if let Some(fast) = blocks(json.as_bytes()) {
                match general {
                    Ok(general) => assert_eq!(fast, general, "{json}"),
                    Err(e) => panic!("{json}: read fast as {fast:?}, the general way fails: {e}"),
                }
            }
        }
    }

    /// The shapes serde_json writes are all read fast.
    #[test]
    fn reads_what_serde_json_writes() {
        let content = vec![
            ContentBlock::Text { text: "t".into() },
            ContentBlock::Reasoning { text: "r".into() },
            ContentBlock::ToolUse {
                id: ToolCallId("c1".into()),
                server: Some("fs".into()),
                name: "read".into(),
                arguments: serde_json::json!({"z": 1, "a": {"nested": [1, "two", null]}}),
            },
            ContentBlock::ToolUse {
                id: ToolCallId("c2".into()),
                server: None,
                name: "list".into(),
                arguments: Value::Null,
            },
            ContentBlock::ToolResult {
                tool_use_id: ToolCallId("c1".into()),
                content: "line\n\"quoted\"".into(),
                is_error: true,
                images: Vec::new(),
            },
            ContentBlock::ToolResult {
                tool_use_id: ToolCallId("c3".into()),
                content: "shot".into(),
                is_error: false,
                images: vec![BlobRef::of("image/png", b"png bytes")],
            },
            ContentBlock::Image(BlobRef::of("image/jpeg", b"jpeg bytes")),
            ContentBlock::Notification {
                source: "ci".into(),
                priority: Priority::High,
                text: "red".into(),
            },
        ];
        let json = serde_json::to_vec(&content).unwrap();
        assert_eq!(blocks(&json), Some(content));
    }
}

//! Memory blocks as records, wire-neutral: a labelled value with a
//! character limit, stored on its own (kind `block`) and attached to
//! agents by id, so that one block can be shared by several agents and an
//! edit by one is seen by all. Every change is one stored write, whoever
//! makes it: a request, or an agent's memory tool ([`super::memory`]).
//!
//! **Invariant.** A stored block has a label and a value never longer
//! than its limit (in characters, as Letta counts them): a change that
//! would break it is refused, naming the limit, and nothing is stored.
//! Create and update keep it in one place, [`BlockRecord::checked`].

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolwire_engine::Engine;

use crate::agents::ids::{check_id, new_id};
use crate::error::{ApiError, ApiResult};

/// The kind of a block's record.
pub const KIND: &str = "block";

/// Letta's default limit of a block's value, in characters.
pub const DEFAULT_LIMIT: u64 = 100_000;

/// The status of a value over its limit, by where the limit came from.
/// Letta validates a body before its handler runs: a body whose own
/// `value` is longer than its own `limit` is invalid (`422`, which Letta's
/// SDK test of blocks expects of an update). A value over a limit the body
/// does not give (the default on create, the block's stored limit on
/// update) is found by the handler: `400`, as Letta's handlers answer a
/// `ValueError`.
fn over_limit_status(limit_in_body: bool) -> StatusCode {
    if limit_in_body {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::BAD_REQUEST
    }
}

/// Letta's descriptions of its two default blocks, given to blocks of
/// those labels created without one.
pub const HUMAN_DESCRIPTION: &str = "The human block: Stores key details about the person you are \
     conversing with, allowing for more personalized and friend-like conversation.";
pub const PERSONA_DESCRIPTION: &str = "The persona block: Stores details about your current \
     persona, guiding how you behave and respond. This helps you to maintain consistency and \
     personality in your interactions.";

/// A block as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRecord {
    pub id: String,
    pub label: String,
    pub value: String,
    pub limit: u64,
    #[serde(default)]
    pub description: Option<String>,
    /// The agent's memory tools may not change it (requests may).
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub metadata: Option<Value>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub hidden: Option<bool>,
    #[serde(default)]
    pub is_template: bool,
    #[serde(default)]
    pub template_name: Option<String>,
    #[serde(default)]
    pub project_id: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What creating a block takes (Letta's `CreateBlock`); also an agent's
/// `memory_blocks` entries.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct BlockCreate {
    pub label: Option<String>,
    pub value: Option<String>,
    pub limit: Option<u64>,
    pub description: Option<String>,
    pub read_only: Option<bool>,
    /// An object, as Letta's schema has it.
    pub metadata: Option<serde_json::Map<String, Value>>,
    pub tags: Option<Vec<String>>,
    pub hidden: Option<bool>,
    pub is_template: Option<bool>,
    pub template_name: Option<String>,
    pub project_id: Option<String>,
}

/// What changing a block takes (Letta's `BlockUpdate`): the same fields
/// as [`BlockCreate`]; those given replace the stored ones.
pub type BlockUpdate = BlockCreate;

/// Characters of `value`, as Letta counts them (Python's `len`).
pub fn chars(value: &str) -> u64 {
    u64::try_from(value.chars().count()).unwrap_or(u64::MAX)
}

impl BlockCreate {
    /// Whether the body gives both a value and the limit it is held to.
    fn limits_its_value(&self) -> bool {
        self.value.is_some() && self.limit.is_some()
    }
}

impl BlockRecord {
    /// A new block from `fields`, checked (a label, a value within its
    /// limit).
    pub fn create(fields: BlockCreate) -> ApiResult<BlockRecord> {
        let limit_in_body = fields.limits_its_value();
        let label = fields.label.unwrap_or_default();
        let description = fields.description.or_else(|| match label.as_str() {
            "human" => Some(HUMAN_DESCRIPTION.to_owned()),
            "persona" => Some(PERSONA_DESCRIPTION.to_owned()),
            _ => None,
        });
        let now = Utc::now();
        BlockRecord {
            id: new_id(KIND),
            label,
            value: fields.value.unwrap_or_default(),
            limit: fields.limit.unwrap_or(DEFAULT_LIMIT),
            description,
            read_only: fields.read_only.unwrap_or(false),
            metadata: fields.metadata.map(Value::Object),
            tags: fields.tags.unwrap_or_default(),
            hidden: fields.hidden,
            is_template: fields.is_template.unwrap_or(false),
            template_name: fields.template_name,
            project_id: fields.project_id,
            created_at: now,
            updated_at: now,
        }
        .checked(limit_in_body)
    }

    /// This block if it keeps the invariants (a label; a value within its
    /// limit, refused naming both, with the status of
    /// [`over_limit_status`]).
    fn checked(self, limit_in_body: bool) -> ApiResult<BlockRecord> {
        if self.label.trim().is_empty() {
            return Err(ApiError::bad_request("a block needs a non-empty `label`"));
        }
        let length = chars(&self.value);
        if length > self.limit {
            return Err(ApiError::new(
                over_limit_status(limit_in_body),
                "BLOCK_LIMIT_EXCEEDED",
                format!(
                    "the value of block `{}` exceeds its limit of {} characters (it has {length})",
                    self.label, self.limit
                ),
            )
            .with("limit", self.limit)
            .with("length", length));
        }
        Ok(self)
    }

    /// This block changed by `fields`, checked against its (new) limit.
    pub fn updated(&self, fields: BlockUpdate) -> ApiResult<BlockRecord> {
        let limit_in_body = fields.limits_its_value();
        let mut block = self.clone();
        if let Some(label) = fields.label {
            block.label = label;
        }
        if let Some(value) = fields.value {
            block.value = value;
        }
        if let Some(limit) = fields.limit {
            block.limit = limit;
        }
        if let Some(d) = fields.description {
            block.description = Some(d);
        }
        if let Some(r) = fields.read_only {
            block.read_only = r;
        }
        if let Some(m) = fields.metadata {
            block.metadata = Some(Value::Object(m));
        }
        if let Some(t) = fields.tags {
            block.tags = t;
        }
        if let Some(h) = fields.hidden {
            block.hidden = Some(h);
        }
        if let Some(t) = fields.is_template {
            block.is_template = t;
        }
        if let Some(t) = fields.template_name {
            block.template_name = Some(t);
        }
        if let Some(p) = fields.project_id {
            block.project_id = Some(p);
        }
        block.updated_at = Utc::now();
        block.checked(limit_in_body)
    }
}

fn unreadable(id: &str, e: serde_json::Error) -> ApiError {
    ApiError::internal(format!("block {id} is unreadable: {e}"))
}

/// Block `id`; not found unless it is one.
pub async fn load(engine: &Engine, id: &str) -> ApiResult<BlockRecord> {
    check_id(KIND, id)?;
    let doc = engine
        .store()
        .document(KIND, id)
        .await?
        .ok_or_else(|| ApiError::not_found("block", id))?;
    serde_json::from_value(doc.body).map_err(|e| unreadable(id, e))
}

/// Every block, oldest first.
pub async fn all(engine: &Engine) -> ApiResult<Vec<BlockRecord>> {
    let mut blocks = Vec::new();
    for doc in engine.store().documents(KIND).await? {
        blocks.push(serde_json::from_value(doc.body).map_err(|e| unreadable(&doc.id, e))?);
    }
    Ok(blocks)
}

/// The blocks `ids` names, in that order; ids whose block is gone are
/// left out (a block deleted while attached leaves the agent).
pub async fn of_ids(engine: &Engine, ids: &[String]) -> ApiResult<Vec<BlockRecord>> {
    let mut blocks = Vec::with_capacity(ids.len());
    for id in ids {
        match load(engine, id).await {
            Ok(block) => blocks.push(block),
            Err(e) if e.status == axum::http::StatusCode::NOT_FOUND => {}
            Err(e) => return Err(e),
        }
    }
    Ok(blocks)
}

/// Stores `block`, in place of its earlier version.
pub async fn save(engine: &Engine, block: &BlockRecord) -> ApiResult<()> {
    let body = serde_json::to_value(block)
        .map_err(|e| ApiError::internal(format!("a block cannot be stored: {e}")))?;
    engine.put_record(KIND, &block.id, &body).await?;
    Ok(())
}

/// Stores several new blocks in one transaction: all or none.
pub async fn save_all(engine: &Engine, blocks: &[BlockRecord]) -> ApiResult<()> {
    if blocks.is_empty() {
        return Ok(());
    }
    let mut changes = Vec::with_capacity(blocks.len());
    for block in blocks {
        let body = serde_json::to_value(block)
            .map_err(|e| ApiError::internal(format!("a block cannot be stored: {e}")))?;
        changes.push((block.id.clone(), Some(body)));
    }
    engine.write_records(KIND, &changes).await?;
    Ok(())
}

/// Removes block `id`.
pub async fn delete(engine: &Engine, id: &str) -> ApiResult<()> {
    engine.delete_record(KIND, id).await?;
    Ok(())
}

/// The lock key of block `id`: one read-modify-write of a block at a time,
/// whether a request or a memory tool makes it.
pub fn lock_key(id: &str) -> String {
    format!("block:{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_over_its_limit_is_refused_naming_the_limit() {
        let err = BlockRecord::create(BlockCreate {
            label: Some("human".into()),
            value: Some("é".repeat(11)),
            limit: Some(10),
            ..BlockCreate::default()
        })
        .unwrap_err();
        assert_eq!(
            err.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "the body's own limit"
        );
        assert!(
            err.message.contains("limit of 10 characters"),
            "{}",
            err.message
        );
        assert!(err.message.contains("it has 11"), "{}", err.message);
        let over_default = BlockRecord::create(BlockCreate {
            label: Some("human".into()),
            value: Some("x".repeat(100_001)),
            ..BlockCreate::default()
        })
        .unwrap_err();
        assert_eq!(
            over_default.status,
            StatusCode::BAD_REQUEST,
            "the default limit"
        );
        assert!(over_default.message.contains("limit of 100000 characters"));

        // Characters, not bytes: ten two-byte characters fit ten.
        let block = BlockRecord::create(BlockCreate {
            label: Some("human".into()),
            value: Some("é".repeat(10)),
            limit: Some(10),
            ..BlockCreate::default()
        })
        .unwrap();
        assert_eq!(block.description.as_deref(), Some(HUMAN_DESCRIPTION));
        // Over the block's stored limit, or a new limit below its value:
        // the handler's 400. Value and limit in one body: 422.
        for (value, limit, status) in [
            (Some("x".repeat(11)), None, StatusCode::BAD_REQUEST),
            (None, Some(9), StatusCode::BAD_REQUEST),
            (
                Some("x".repeat(11)),
                Some(10),
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
        ] {
            let err = block
                .updated(BlockUpdate {
                    value,
                    limit,
                    ..BlockUpdate::default()
                })
                .unwrap_err();
            assert_eq!(err.status, status, "{}", err.message);
            assert_eq!(err.code, "BLOCK_LIMIT_EXCEEDED");
        }
        assert!(
            BlockRecord::create(BlockCreate::default()).is_err(),
            "a label is required"
        );
        assert!(
            block
                .updated(BlockUpdate {
                    label: Some(" ".into()),
                    ..BlockUpdate::default()
                })
                .is_err(),
            "and may not become empty"
        );
    }
}

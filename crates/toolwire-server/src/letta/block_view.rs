//! A memory block as Letta shows it (`BlockResponse`), for the block
//! routes and the agent's JSON alike.

use serde_json::{Value, json};

use crate::agents::blocks::BlockRecord;

/// A block's JSON (Letta's `BlockResponse`).
pub fn block_json(block: &BlockRecord) -> Value {
    json!({
        "id": block.id,
        "label": block.label,
        "value": block.value,
        "limit": block.limit,
        "description": block.description,
        "read_only": block.read_only,
        "metadata": block.metadata.clone().unwrap_or_else(|| json!({})),
        "tags": block.tags,
        "hidden": block.hidden,
        "is_template": block.is_template,
        "template_name": block.template_name,
        "project_id": block.project_id,
        "template_id": null,
        "base_template_id": null,
        "deployment_id": null,
        "entity_id": null,
        "preserve_on_migration": false,
        "created_by_id": null,
        "last_updated_by_id": null,
        "created_at": block.created_at,
        "updated_at": block.updated_at,
    })
}

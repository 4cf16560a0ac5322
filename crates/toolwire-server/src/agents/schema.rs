//! A tool record's `json_schema`: the function schema `{name,
//! description, parameters}`, the shape Letta stores and serves (tool
//! records are kept in it so the Letta door serves them as stored). A
//! client may also send the arguments schema alone. The tools crate knows
//! only the wire-neutral `ToolSchemaInfo`.

use serde_json::{Value, json};
use toolwire_tools::python::{PythonToolError, ToolSchemaInfo};

/// Reads a client's `json_schema`: either the arguments schema itself or
/// Letta's whole function schema (`{"name", "description", "parameters"}`).
pub fn read(name: &str, json_schema: &Value) -> Result<ToolSchemaInfo, PythonToolError> {
    let Value::Object(object) = json_schema else {
        return Err(PythonToolError::InvalidSchema(format!(
            "expected a JSON object, got {json_schema}"
        )));
    };
    match object.get("parameters") {
        Some(parameters) => {
            let description = object
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default();
            ToolSchemaInfo::new(name, description, parameters.clone())
        }
        None if !object.is_empty()
            && !object.contains_key("type")
            && !object.contains_key("properties") =>
        {
            Err(PythonToolError::InvalidSchema(
                "expected an arguments schema (`type`, `properties`) or a function schema \
                 (`name`, `description`, `parameters`)"
                    .into(),
            ))
        }
        None => ToolSchemaInfo::new(name, "", json_schema.clone()),
    }
}

/// `schema` as Letta stores it in a tool's `json_schema`.
pub fn to_json(schema: &ToolSchemaInfo) -> Value {
    json!({
        "name": schema.name,
        "description": schema.description,
        "parameters": schema.parameters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_schema_in_either_shape() {
        let params =
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let bare = read("add", &params).unwrap();
        assert_eq!(bare.parameters, params);
        assert_eq!(bare.description, "");

        let letta = json!({"name": "add", "description": "Adds.", "parameters": params});
        let full = read("add", &letta).unwrap();
        assert_eq!(full.parameters, params);
        assert_eq!(full.description, "Adds.");
        assert_eq!(to_json(&full), letta);

        let only_props = read("f", &json!({"properties": {}})).unwrap();
        assert_eq!(
            only_props.parameters,
            json!({"properties": {}, "type": "object"})
        );

        for bad in [
            json!([]),
            json!({"type": "string"}),
            json!({"parameters": 3}),
            json!({"foo": 1}),
        ] {
            let err = read("f", &bad).unwrap_err();
            assert!(
                matches!(err, PythonToolError::InvalidSchema(_)),
                "{bad}: {err}"
            );
        }
    }
}

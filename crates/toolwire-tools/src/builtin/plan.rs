//! `update_plan`: the model's short task list for the work at hand (as in
//! OpenAI's codex). It changes nothing and keeps nothing: the plan lives
//! in the conversation, as the call's arguments, and front doors that can
//! show a plan read it from there ([`parse_plan`]).

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::common::spec;
use crate::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// The tool's name.
pub const UPDATE_PLAN: &str = "update_plan";

/// Steps in one plan, at most.
pub const MAX_STEPS: usize = 50;
/// Characters in one step, at most.
pub const MAX_STEP_CHARS: usize = 500;
/// Characters in the explanation, at most.
pub const MAX_EXPLANATION_CHARS: usize = 2000;

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    InProgress,
    Completed,
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    pub step: String,
    pub status: StepStatus,
}

/// A whole plan, as `update_plan` takes it (each call replaces the last).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    #[serde(default)]
    pub explanation: Option<String>,
    pub plan: Vec<PlanStep>,
}

impl Plan {
    /// How many steps are completed.
    pub fn completed(&self) -> usize {
        self.plan
            .iter()
            .filter(|s| s.status == StepStatus::Completed)
            .count()
    }
}

/// The plan in `arguments`, checked: 1 to [`MAX_STEPS`] steps, none empty
/// or longer than [`MAX_STEP_CHARS`], at most one `in_progress`, an
/// explanation of at most [`MAX_EXPLANATION_CHARS`]. Steps are trimmed.
pub fn parse_plan(arguments: &Value) -> Result<Plan, String> {
    let mut plan: Plan = serde_json::from_value(arguments.clone()).map_err(|e| e.to_string())?;
    if plan.plan.is_empty() {
        return Err("`plan` must have at least one step".into());
    }
    if plan.plan.len() > MAX_STEPS {
        return Err(format!(
            "`plan` has {} steps; at most {MAX_STEPS} (keep it short: merge small steps)",
            plan.plan.len()
        ));
    }
    for (i, step) in plan.plan.iter_mut().enumerate() {
        let trimmed = step.step.trim();
        if trimmed.is_empty() {
            return Err(format!("step {} is empty", i + 1));
        }
        let chars = trimmed.chars().count();
        if chars > MAX_STEP_CHARS {
            return Err(format!(
                "step {} has {chars} characters; at most {MAX_STEP_CHARS} (a step is one short sentence)",
                i + 1
            ));
        }
        if trimmed.len() != step.step.len() {
            step.step = trimmed.to_owned();
        }
    }
    let in_progress = plan
        .plan
        .iter()
        .filter(|s| s.status == StepStatus::InProgress)
        .count();
    if in_progress > 1 {
        return Err(format!(
            "{in_progress} steps are in_progress; at most one step may be in_progress at a time"
        ));
    }
    if let Some(explanation) = &plan.explanation {
        let chars = explanation.chars().count();
        if chars > MAX_EXPLANATION_CHARS {
            return Err(format!(
                "`explanation` has {chars} characters; at most {MAX_EXPLANATION_CHARS}"
            ));
        }
    }
    Ok(plan)
}

pub struct UpdatePlan {
    spec: Arc<ToolSpec>,
}

impl Default for UpdatePlan {
    fn default() -> Self {
        Self::new()
    }
}

impl UpdatePlan {
    pub fn new() -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "explanation": {
                    "type": "string",
                    "maxLength": MAX_EXPLANATION_CHARS,
                    "description": "Optional: why the plan changed, in a sentence."
                },
                "plan": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_STEPS,
                    "description": "The whole plan, in order (it replaces the previous one).",
                    "items": {
                        "type": "object",
                        "properties": {
                            "step": {"type": "string", "minLength": 1, "maxLength": MAX_STEP_CHARS, "description": "What to do, in a short sentence."},
                            "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}
                        },
                        "required": ["step", "status"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["plan"],
            "additionalProperties": false
        });
        let description = "Updates the task plan shown to the user. Use it for work that takes \
            several steps (not for simple one-step requests): give the whole plan each time, \
            a few short steps in order, each pending, in_progress or completed, with at most \
            one in_progress. Call it when you make the plan, when you start a step and when you \
            finish one (mark it completed and the next in_progress), and when the plan changes \
            (say why in `explanation`). It changes nothing in the workspace.";
        UpdatePlan {
            spec: spec(UPDATE_PLAN, description, parameters, true),
        }
    }
}

#[async_trait]
impl Tool for UpdatePlan {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let plan = parse_plan(&arguments).map_err(ToolError::InvalidArguments)?;
        Ok(ToolOutput::ok(format!(
            "Plan updated: {}/{} completed",
            plan.completed(),
            plan.plan.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(statuses: &[&str]) -> Value {
        let plan: Vec<Value> = statuses
            .iter()
            .enumerate()
            .map(|(i, s)| json!({"step": format!("step {i}"), "status": s}))
            .collect();
        json!({ "plan": plan })
    }

    async fn call(arguments: Value) -> Result<ToolOutput, ToolError> {
        UpdatePlan::new()
            .call(arguments, ToolContext::detached("c"))
            .await
    }

    #[tokio::test]
    async fn a_valid_plan_is_counted() {
        let out = call(steps(&["completed", "in_progress", "pending"]))
            .await
            .unwrap();
        assert_eq!(out.content, "Plan updated: 1/3 completed");
        assert!(!out.is_error);
    }

    #[test]
    fn the_plan_is_parsed_in_order_and_trimmed() {
        let plan = parse_plan(&json!({
            "explanation": "why",
            "plan": [
                {"step": "  Read the code ", "status": "completed"},
                {"step": "Fix it", "status": "in_progress"},
                {"step": "Test it", "status": "pending"}
            ]
        }))
        .unwrap();
        assert_eq!(plan.explanation.as_deref(), Some("why"));
        let got: Vec<_> = plan
            .plan
            .iter()
            .map(|s| (s.step.as_str(), s.status))
            .collect();
        assert_eq!(
            got,
            [
                ("Read the code", StepStatus::Completed),
                ("Fix it", StepStatus::InProgress),
                ("Test it", StepStatus::Pending),
            ]
        );
    }

    #[tokio::test]
    async fn two_steps_in_progress_are_refused() {
        let err = call(steps(&["in_progress", "in_progress"]))
            .await
            .unwrap_err();
        assert!(matches!(err, ToolError::InvalidArguments(_)));
        assert!(err.to_string().contains("at most one step"), "{err}");
    }

    #[test]
    fn empty_plans_and_steps_are_refused() {
        let err = parse_plan(&json!({"plan": []})).unwrap_err();
        assert!(err.contains("at least one step"), "{err}");
        let err = parse_plan(&json!({"plan": [{"step": "a", "status": "pending"}, {"step": "  ", "status": "pending"}]}))
            .unwrap_err();
        assert_eq!(err, "step 2 is empty");
    }

    #[test]
    fn sizes_are_bounded() {
        let many = vec!["pending"; MAX_STEPS + 1];
        assert!(
            parse_plan(&steps(&many))
                .unwrap_err()
                .contains("at most 50")
        );
        assert!(parse_plan(&steps(&vec!["pending"; MAX_STEPS])).is_ok());
        let long = "x".repeat(MAX_STEP_CHARS + 1);
        let err = parse_plan(&json!({"plan": [{"step": long, "status": "pending"}]})).unwrap_err();
        assert!(err.contains("step 1 has 501 characters"), "{err}");
        let mut args = steps(&["pending"]);
        args["explanation"] = json!("y".repeat(MAX_EXPLANATION_CHARS + 1));
        assert!(parse_plan(&args).unwrap_err().contains("`explanation`"));
    }

    #[test]
    fn bad_shapes_are_refused() {
        for bad in [
            json!(null),
            json!({}),
            json!({"plan": [{"step": "a", "status": "done"}]}),
            json!({"plan": [{"step": "a"}]}),
            json!({"plan": [{"step": "a", "status": "pending", "extra": 1}]}),
            json!({"plan": [], "other": 1}),
        ] {
            assert!(parse_plan(&bad).is_err(), "{bad}");
        }
        let err = parse_plan(&json!({"plan": [{"step": "a", "status": "done"}]})).unwrap_err();
        assert!(err.contains("unknown variant `done`"), "{err}");
    }

    #[test]
    fn the_tool_is_read_only_with_a_closed_schema() {
        let tool = UpdatePlan::new();
        let spec = tool.spec();
        assert_eq!(spec.name, "update_plan");
        assert!(spec.read_only);
        assert_eq!(spec.parameters["additionalProperties"], false);
        assert_eq!(spec.parameters["required"], json!(["plan"]));
    }
}

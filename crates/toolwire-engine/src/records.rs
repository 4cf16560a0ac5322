//! Records a front door keeps beside the conversations (a Letta agent, a
//! tool's source, an editor session's "always" answers): JSON documents
//! by kind and id, written only through the engine. What they mean is
//! the front door's; the engine only stores them. Read them with the
//! store's `document`/`documents`.

use crate::engine::Engine;
use crate::error::EngineError;

impl Engine {
    /// Stores record `(kind, id)`, in place of any before it.
    pub async fn put_record(
        &self,
        kind: &str,
        id: &str,
        body: &serde_json::Value,
    ) -> Result<(), EngineError> {
        Ok(self.writer().put_document(kind, id, body).await?)
    }

    /// Stores each record `(kind, id, body)`, in place of any before it,
    /// all or none.
    pub async fn put_records(
        &self,
        records: &[(&str, &str, &serde_json::Value)],
    ) -> Result<(), EngineError> {
        Ok(self.writer().put_documents(records).await?)
    }

    /// Removes record `(kind, id)`; says whether it was there.
    pub async fn delete_record(&self, kind: &str, id: &str) -> Result<bool, EngineError> {
        Ok(self.writer().delete_document(kind, id).await?)
    }

    /// Stores (`Some` body) or removes (`None`) records of `kind`, all or
    /// none.
    pub async fn write_records(
        &self,
        kind: &str,
        changes: &[(String, Option<serde_json::Value>)],
    ) -> Result<(), EngineError> {
        Ok(self.writer().write_documents(kind, changes).await?)
    }
}

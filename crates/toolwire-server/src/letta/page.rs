//! Cursor pages as Letta's lists serve them: `order` (asc or desc by
//! creation), then items strictly after `after` / before `before` (ids),
//! then at most `limit`. The SDKs page on by asking `after` the last id of
//! a page until one comes back empty, so a cursor must always move on.

use serde::Deserialize;

use crate::error::ApiError;

/// The query of a list.
#[derive(Debug, Default, Deserialize)]
pub struct PageQuery {
    pub after: Option<String>,
    pub before: Option<String>,
    /// A string here, because a query flattened into a larger one reaches
    /// serde as strings; read by [`PageQuery::limit`].
    pub limit: Option<String>,
    pub order: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

impl PageQuery {
    pub fn limit(&self, default: usize) -> Result<usize, ApiError> {
        match self.limit.as_deref() {
            None => Ok(default),
            Some(text) => text.parse::<usize>().map(|n| n.max(1)).map_err(|_| {
                ApiError::bad_request(format!("limit must be a positive number, not `{text}`"))
            }),
        }
    }

    pub fn order(&self, default: Order) -> Result<Order, ApiError> {
        match self.order.as_deref() {
            None => Ok(default),
            Some("asc") => Ok(Order::Asc),
            Some("desc") => Ok(Order::Desc),
            Some(other) => Err(ApiError::bad_request(format!(
                "order must be `asc` or `desc`, not `{other}`"
            ))),
        }
    }

    /// The page of `items` (oldest first) that this query asks for. Items
    /// sharing an id (parts of one message) are kept together, and an
    /// unknown cursor gives an empty page rather than starting over.
    pub fn page<T>(
        &self,
        mut items: Vec<T>,
        id_of: impl Fn(&T) -> &str,
        default_order: Order,
        default_limit: usize,
    ) -> Result<Vec<T>, ApiError> {
        let limit = self.limit(default_limit)?;
        if self.order(default_order)? == Order::Desc {
            items.reverse();
        }
        let position = |id: &str, items: &[T], last: bool| {
            let mut found = items.iter().enumerate().filter(|(_, t)| id_of(t) == id);
            if last {
                found.last().map(|(i, _)| i)
            } else {
                found.next().map(|(i, _)| i)
            }
        };
        let start = match &self.after {
            Some(after) => match position(after, &items, true) {
                Some(i) => i + 1,
                None => return Ok(Vec::new()),
            },
            None => 0,
        };
        let end = match &self.before {
            Some(before) => match position(before, &items, false) {
                Some(i) => i,
                None => return Ok(Vec::new()),
            },
            None => items.len(),
        };
        if start >= end {
            return Ok(Vec::new());
        }
        let window: Vec<T> = items.drain(start..end).collect();
        // With `before` alone, the page is the part just before the cursor.
        let from_end = self.before.is_some() && self.after.is_none();
        Ok(take_whole(window, limit, from_end, &id_of))
    }
}

impl PageQuery {
    /// The page of a message history (`items` oldest first) as Letta's
    /// server gives it: the items after `after` (newer) and before
    /// `before` (older), of which the newest `limit` (`order=desc`, the
    /// default) or the oldest `limit` (`order=asc`), always oldest
    /// first. An unknown cursor gives an empty page.
    pub fn history_page<T>(
        &self,
        mut items: Vec<T>,
        id_of: impl Fn(&T) -> &str,
        default_limit: usize,
    ) -> Result<Vec<T>, ApiError> {
        let limit = self.limit(default_limit)?;
        let newest = self.order(Order::Desc)? == Order::Desc;
        let start = match &self.after {
            Some(after) => match items.iter().rposition(|t| id_of(t) == after) {
                Some(i) => i + 1,
                None => return Ok(Vec::new()),
            },
            None => 0,
        };
        let end = match &self.before {
            Some(before) => match items.iter().position(|t| id_of(t) == before) {
                Some(i) => i,
                None => return Ok(Vec::new()),
            },
            None => items.len(),
        };
        if start >= end {
            return Ok(Vec::new());
        }
        let mut window: Vec<T> = items.drain(start..end).collect();
        // `limit` counts messages (runs of items sharing an id), as Letta
        // counts the stored messages its parts come from.
        if newest {
            window.reverse();
        }
        let mut groups = 0;
        let mut cut = window.len();
        for i in 0..window.len() {
            if i == 0 || id_of(&window[i]) != id_of(&window[i - 1]) {
                if groups == limit {
                    cut = i;
                    break;
                }
                groups += 1;
            }
        }
        window.truncate(cut);
        if newest {
            window.reverse();
        }
        Ok(window)
    }
}

/// At most `limit` items from one end of `items`, never splitting a run of
/// items with the same id (a run longer than `limit` is taken whole when
/// it comes first, so that a page is never empty while items remain).
fn take_whole<T>(
    mut items: Vec<T>,
    limit: usize,
    from_end: bool,
    id_of: &impl Fn(&T) -> &str,
) -> Vec<T> {
    if items.len() <= limit {
        return items;
    }
    if from_end {
        items.reverse();
    }
    let mut cut = 0;
    while cut < items.len() {
        let id = id_of(&items[cut]).to_owned();
        let mut run_end = cut;
        while run_end < items.len() && id_of(&items[run_end]) == id {
            run_end += 1;
        }
        if run_end > limit && cut > 0 {
            break;
        }
        cut = run_end;
        if cut >= limit {
            break;
        }
    }
    items.truncate(cut);
    if from_end {
        items.reverse();
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(after: Option<&str>, before: Option<&str>, limit: usize, order: &str) -> PageQuery {
        PageQuery {
            after: after.map(str::to_owned),
            before: before.map(str::to_owned),
            limit: Some(limit.to_string()),
            order: Some(order.to_owned()),
        }
    }

    fn ids(items: &[(&'static str, u32)]) -> Vec<String> {
        items.iter().map(|(id, n)| format!("{id}{n}")).collect()
    }

    const ITEMS: [(&str, u32); 6] = [("a", 0), ("b", 0), ("b", 1), ("c", 0), ("d", 0), ("e", 0)];

    fn page(query: PageQuery) -> Vec<String> {
        ids(&query.page(ITEMS.to_vec(), |t| t.0, Order::Asc, 50).unwrap())
    }

    #[test]
    fn pages_move_on_and_keep_parts_together() {
        assert_eq!(
            page(q(None, None, 2, "asc")),
            ["a0"],
            "b's two parts do not fit"
        );
        assert_eq!(page(q(Some("a"), None, 2, "asc")), ["b0", "b1"]);
        assert_eq!(page(q(Some("b"), None, 2, "asc")), ["c0", "d0"]);
        assert_eq!(page(q(Some("e"), None, 2, "asc")), Vec::<String>::new());
        assert_eq!(page(q(None, None, 1, "asc")), ["a0"]);
        assert_eq!(
            page(q(Some("a"), None, 1, "asc")),
            ["b0", "b1"],
            "a long run is taken whole"
        );
    }

    #[test]
    fn descending_and_before() {
        assert_eq!(page(q(None, None, 3, "desc")), ["e0", "d0", "c0"]);
        assert_eq!(page(q(Some("c"), None, 3, "desc")), ["b1", "b0", "a0"]);
        assert_eq!(
            page(q(None, Some("d"), 2, "asc")),
            ["c0"],
            "b's parts do not fit"
        );
        assert_eq!(
            page(q(Some("a"), Some("e"), 10, "asc")),
            ["b0", "b1", "c0", "d0"]
        );
    }

    fn history(query: PageQuery) -> Vec<String> {
        ids(&query.history_page(ITEMS.to_vec(), |t| t.0, 50).unwrap())
    }

    #[test]
    fn histories_give_the_newest_oldest_first_and_after_is_newer() {
        assert_eq!(history(q(None, None, 3, "desc")), ["c0", "d0", "e0"]);
        assert_eq!(
            history(q(None, None, 3, "asc")),
            ["a0", "b0", "b1", "c0"],
            "the oldest three messages, parts together"
        );
        assert_eq!(history(q(Some("b"), None, 50, "desc")), ["c0", "d0", "e0"]);
        assert_eq!(history(q(Some("b"), None, 1, "desc")), ["e0"]);
        assert_eq!(history(q(None, Some("c"), 2, "desc")), ["a0", "b0", "b1"]);
        assert_eq!(history(q(None, Some("d"), 1, "desc")), ["c0"]);
        assert_eq!(history(q(Some("e"), None, 5, "desc")), Vec::<String>::new());
        assert!(history(q(Some("zz"), None, 5, "desc")).is_empty());
    }

    #[test]
    fn unknown_cursors_and_orders() {
        assert!(page(q(Some("zz"), None, 2, "asc")).is_empty());
        let bad = q(None, None, 2, "sideways").page(ITEMS.to_vec(), |t| t.0, Order::Asc, 5);
        assert!(bad.unwrap_err().message.contains("sideways"));
    }
}

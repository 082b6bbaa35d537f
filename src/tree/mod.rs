//! The smith tree: the model (smiths, levels, states), templates and the scaffold.

pub mod layout;
pub mod model;
pub mod registry;
pub mod scaffold_plan;
pub mod template;

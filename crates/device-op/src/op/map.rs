//! `map` and `inspect`: host-only transforms, built as `then` + `value`.

use super::then::{Continuation, Then};
use super::value::{value, Value};
use crate::describe::short_type_name;

/// The continuation behind [`DeviceOpExt::map`](super::DeviceOpExt::map).
#[derive(Debug)]
pub struct MapFn<F>(pub(crate) F);

impl<In, F, R> Continuation<In> for MapFn<F>
where
    F: FnOnce(In) -> R + Send,
    R: Send,
{
    type Next = Value<R>;
    fn call(self, input: In) -> Value<R> {
        value((self.0)(input))
    }
    fn describe_label(&self) -> String {
        format!("map {}", short_type_name::<F>())
    }
}

/// The continuation behind [`DeviceOpExt::inspect`](super::DeviceOpExt::inspect).
#[derive(Debug)]
pub struct InspectFn<F>(pub(crate) F);

impl<In, F> Continuation<In> for InspectFn<F>
where
    In: Send,
    F: FnOnce(&In) + Send,
{
    type Next = Value<In>;
    fn call(self, input: In) -> Value<In> {
        (self.0)(&input);
        value(input)
    }
    fn describe_label(&self) -> String {
        format!("inspect {}", short_type_name::<F>())
    }
}

/// The op returned by [`DeviceOpExt::map`](super::DeviceOpExt::map).
pub type Map<A, F> = Then<A, MapFn<F>>;

/// The op returned by [`DeviceOpExt::inspect`](super::DeviceOpExt::inspect).
pub type Inspect<A, F> = Then<A, InspectFn<F>>;

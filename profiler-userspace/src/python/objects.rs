//! Where CPython keeps the fields user space reads of objects other than the interpreter's own
//! structures (those are per version, in `layout`): types, containers, numbers, functions,
//! cells, modules and weak references. The same on every supported version (3.8-3.15; the
//! notes say where a field is only read on some), on 64-bit builds without `Py_DEBUG`'s extra
//! header words. No crate describes CPython's objects for a reader outside the process, so
//! they are written here, each measured against the versions' headers.

/// `PyTypeObject`.
pub struct TypeObject {
    pub name: u64,
    pub basicsize: u64,
    pub as_buffer: u64,
    pub flags: u64,
    /// Read on 3.11-3.13 (a subclass of asyncio's `Task`).
    pub base: u64,
    pub dictoffset: u64,
}
pub const TYPE: TypeObject = TypeObject {
    name: 24,
    basicsize: 32,
    as_buffer: 160,
    flags: 168,
    base: 256,
    dictoffset: 288,
};
/// `Py_TPFLAGS_INLINE_VALUES` (3.13+).
pub const TPFLAGS_INLINE_VALUES: u64 = 1 << 2;

/// `PyHeapTypeObject::ht_module` (read on 3.12 and 3.13).
pub const HEAP_TYPE_MODULE: u64 = 888;
/// `PyModuleObject::md_state`.
pub const MODULE_STATE: u64 = 32;

/// `PyVarObject::ob_size`, then the items of a tuple, or a list's item array.
pub struct VarObject {
    pub size: u64,
    pub tuple_items: u64,
    pub list_items: u64,
}
pub const VAR: VarObject = VarObject {
    size: 16,
    tuple_items: 24,
    list_items: 24,
};

/// `PySetObject`'s `used`, `mask` and `table`; a table entry is a key and a hash.
pub struct SetObject {
    pub used: usize,
    pub mask: usize,
    pub table: usize,
}
pub const SET: SetObject = SetObject {
    used: 24,
    mask: 32,
    table: 40,
};

/// `PyLongObject`'s `lv_tag` and first 30-bit digit (3.12+).
pub struct LongObject {
    pub tag: usize,
    pub digits: usize,
}
pub const LONG: LongObject = LongObject {
    tag: 16,
    digits: 24,
};

/// A `bytes` object's `ob_size` and `ob_sval`.
pub struct BytesObject {
    pub size: u64,
    pub data: u64,
}
pub const BYTES: BytesObject = BytesObject { size: 16, data: 32 };

/// `PyCFunctionObject::m_self`, `PyMethodObject::im_self`, `PyFunctionObject::func_closure`
/// (read on 3.11-3.13) and `PyCellObject::ob_ref`.
pub const CFUNCTION_SELF: u64 = 24;
pub const METHOD_SELF: u64 = 24;
pub const FUNCTION_CLOSURE: u64 = 72;
pub const CELL_REF: u64 = 16;

/// `PyWeakReference::wr_object`.
pub const WEAKREF_OBJECT: u64 = 16;

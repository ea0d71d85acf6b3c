/* Prints the offsets of every field symbolize/python.rs reads, from the
 * headers of the CPython it is compiled against (test
 * `layouts_match_each_installed_cpythons_headers`). Before 3.11 the
 * names are those of `Layout`'s fields, which hold the older fields:
 * `tstate_native_thread_id` is `thread_id` (pthread_self()),
 * `tstate_frame` is `frame`, `frame_*` are `PyFrameObject`'s, and
 * `code_qualname` is `co_name`. */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_MINOR_VERSION >= 9
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#else
#include "internal/pycore_pystate.h"
#endif
#if PY_MINOR_VERSION >= 11
#include "internal/pycore_frame.h"
#include "internal/pycore_code.h"
#else
#include "frameobject.h"
#endif
int main(void){
  printf("minor %d\n", PY_MINOR_VERSION);
  printf("runtime_interpreters_head %zu\n", offsetof(_PyRuntimeState, interpreters.head));
  printf("tstate_next %zu\n", offsetof(PyThreadState, next));
#if PY_MINOR_VERSION >= 11
  printf("interp_threads_head %zu\n", offsetof(PyInterpreterState, threads.head));
  printf("tstate_native_thread_id %zu\n", offsetof(PyThreadState, native_thread_id));
#else
  printf("interp_threads_head %zu\n", offsetof(PyInterpreterState, tstate_head));
  printf("tstate_native_thread_id %zu\n", offsetof(PyThreadState, thread_id));
  printf("tstate_frame %zu\n", offsetof(PyThreadState, frame));
#endif
#if PY_MINOR_VERSION >= 11 && PY_MINOR_VERSION < 13
  printf("tstate_cframe %zu\n", offsetof(PyThreadState, cframe));
  printf("cframe_current_frame %zu\n", offsetof(_PyCFrame, current_frame));
#elif PY_MINOR_VERSION >= 13
  printf("tstate_current_frame %zu\n", offsetof(PyThreadState, current_frame));
#endif
#if PY_MINOR_VERSION < 11
  printf("frame_code %zu\n", offsetof(PyFrameObject, f_code));
  printf("frame_instr %zu\n", offsetof(PyFrameObject, f_lasti));
  printf("frame_previous %zu\n", offsetof(PyFrameObject, f_back));
#elif PY_MINOR_VERSION < 13
  printf("frame_code %zu\n", offsetof(_PyInterpreterFrame, f_code));
  printf("frame_instr %zu\n", offsetof(_PyInterpreterFrame, prev_instr));
#else
  printf("frame_code %zu\n", offsetof(_PyInterpreterFrame, f_executable));
  printf("frame_instr %zu\n", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
#if PY_MINOR_VERSION >= 11
  printf("frame_previous %zu\n", offsetof(_PyInterpreterFrame, previous));
  printf("frame_owner %zu\n", offsetof(_PyInterpreterFrame, owner));
  printf("code_adaptive %zu\n", offsetof(PyCodeObject, co_code_adaptive));
  printf("code_qualname %zu\n", offsetof(PyCodeObject, co_qualname));
  printf("code_linetable %zu\n", offsetof(PyCodeObject, co_linetable));
#else
  printf("code_qualname %zu\n", offsetof(PyCodeObject, co_name));
#endif
#if PY_MINOR_VERSION == 11
  printf("frame_is_entry %zu\n", offsetof(_PyInterpreterFrame, is_entry));
#endif
#if PY_MINOR_VERSION == 10
  printf("code_linetable %zu\n", offsetof(PyCodeObject, co_linetable));
#elif PY_MINOR_VERSION < 10
  printf("code_linetable %zu\n", offsetof(PyCodeObject, co_lnotab));
#endif
  printf("code_filename %zu\n", offsetof(PyCodeObject, co_filename));
  printf("code_firstlineno %zu\n", offsetof(PyCodeObject, co_firstlineno));
  printf("ascii_size %zu\n", sizeof(PyASCIIObject));
  printf("compact_size %zu\n", sizeof(PyCompactUnicodeObject));
  printf("OB_TYPE %zu\n", offsetof(PyObject, ob_type));
  printf("STR_LENGTH %zu\n", offsetof(PyASCIIObject, length));
  printf("STR_STATE %zu\n", offsetof(PyASCIIObject, state));
  printf("BYTES_DATA %zu\n", offsetof(PyBytesObject, ob_sval));
  printf("VAR_SIZE %zu\n", offsetof(PyVarObject, ob_size));
  return 0;
}

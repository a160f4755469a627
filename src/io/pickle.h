// A Python object tree (None, bool, int, float, str, list, dict with str keys) and its
// pickle, written with the opcodes both Python's unpickler and the JavaScript one of
// pytorch.org/memory_viz read: PROTO 4, EMPTY_DICT/EMPTY_LIST, MARK, SETITEMS/APPENDS (in
// batches of 1000, as Python writes them), BININT1/BININT2/BININT, LONG1 beyond 32 bits,
// SHORT_BINUNICODE/BINUNICODE, BINFLOAT, NONE, NEWTRUE/NEWFALSE, STOP. Nothing else: no
// memo, no frames, no bytes, no GLOBAL/REDUCE.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace llmhpc {

class PyObject {
 public:
  enum class Kind { None, Bool, Int, Float, Str, List, Dict };

  PyObject() = default;  // None
  static PyObject boolean(bool v);
  static PyObject integer(int64_t v);
  static PyObject real(double v);
  static PyObject str(std::string v);
  static PyObject list();
  static PyObject dict();

  // A list's next item; a dict's entry (keys in the order set; a key set twice is a bug).
  PyObject& append(PyObject item);
  PyObject& set(const std::string& key, PyObject value);

  Kind kind() const { return kind_; }
  const std::vector<PyObject>& items() const { return items_; }   // list items, or dict values
  const std::vector<std::string>& keys() const { return keys_; }  // dict keys
  int64_t int_value() const { return int_; }                      // Bool, Int
  double real_value() const { return real_; }                     // Float
  const std::string& str_value() const { return str_; }           // Str

 private:
  Kind kind_ = Kind::None;
  int64_t int_ = 0;
  double real_ = 0;
  std::string str_;
  std::vector<PyObject> items_;
  std::vector<std::string> keys_;
};

// Appends the pickle of `o` (PROTO ... STOP) to `out`.
void write_pickle(const PyObject& o, std::string& out);
std::string pickle(const PyObject& o);

}  // namespace llmhpc

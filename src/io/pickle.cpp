#include "src/io/pickle.h"

#include <algorithm>
#include <cstring>

#include "src/core/check.h"

namespace llmhpc {
namespace {

constexpr size_t kBatch = 1000;  // items per APPENDS/SETITEMS, as Python's pickler batches

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}

void put_int(std::string& out, int64_t v) {
  if (v >= 0 && v < 256) {
    out.push_back('K');  // BININT1
    out.push_back(char(v));
  } else if (v >= 0 && v < 65536) {
    out.push_back('M');  // BININT2
    out.push_back(char(v & 0xff));
    out.push_back(char(v >> 8));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out.push_back('J');  // BININT, signed little-endian
    put_u32(out, uint32_t(int32_t(v)));
  } else {
    // LONG1: the shortest little-endian two's complement that keeps the sign.
    uint8_t bytes[8];
    for (int i = 0; i < 8; ++i) bytes[i] = uint8_t(uint64_t(v) >> (8 * i));
    int n = 8;
    while (n > 1 &&
           ((bytes[n - 1] == 0x00 && !(bytes[n - 2] & 0x80)) || (bytes[n - 1] == 0xff && (bytes[n - 2] & 0x80))))
      --n;
    out.push_back(char(0x8a));
    out.push_back(char(n));
    out.append(reinterpret_cast<const char*>(bytes), size_t(n));
  }
}

void put_str(std::string& out, const std::string& s) {
  if (s.size() < 256) {
    out.push_back(char(0x8c));  // SHORT_BINUNICODE
    out.push_back(char(s.size()));
  } else {
    LLMHPC_CHECK(s.size() <= UINT32_MAX, "a string too long to pickle");
    out.push_back('X');  // BINUNICODE
    put_u32(out, uint32_t(s.size()));
  }
  out += s;
}

}  // namespace

PyObject PyObject::boolean(bool v) {
  PyObject o;
  o.kind_ = Kind::Bool;
  o.int_ = v;
  return o;
}
PyObject PyObject::integer(int64_t v) {
  PyObject o;
  o.kind_ = Kind::Int;
  o.int_ = v;
  return o;
}
PyObject PyObject::real(double v) {
  PyObject o;
  o.kind_ = Kind::Float;
  o.real_ = v;
  return o;
}
PyObject PyObject::str(std::string v) {
  PyObject o;
  o.kind_ = Kind::Str;
  o.str_ = std::move(v);
  return o;
}
PyObject PyObject::list() {
  PyObject o;
  o.kind_ = Kind::List;
  return o;
}
PyObject PyObject::dict() {
  PyObject o;
  o.kind_ = Kind::Dict;
  return o;
}

PyObject& PyObject::append(PyObject item) {
  LLMHPC_CHECK(kind_ == Kind::List, "append to a Python object that is not a list");
  items_.push_back(std::move(item));
  return items_.back();
}

PyObject& PyObject::set(const std::string& key, PyObject value) {
  LLMHPC_CHECK(kind_ == Kind::Dict, "set on a Python object that is not a dict");
  for (const std::string& k : keys_) LLMHPC_CHECK(k != key, "dict key '" + key + "' set twice");
  keys_.push_back(key);
  items_.push_back(std::move(value));
  return items_.back();
}

namespace {

void put_object(const PyObject& o, std::string& out) {
  switch (o.kind()) {
    case PyObject::Kind::None: out.push_back('N'); break;
    case PyObject::Kind::Bool: out.push_back(char(o.int_value() ? 0x88 : 0x89)); break;
    case PyObject::Kind::Int: put_int(out, o.int_value()); break;
    case PyObject::Kind::Float: {
      out.push_back('G');  // BINFLOAT, big-endian IEEE double
      const double v = o.real_value();
      uint64_t bits;
      std::memcpy(&bits, &v, 8);
      for (int i = 7; i >= 0; --i) out.push_back(char((bits >> (8 * i)) & 0xff));
      break;
    }
    case PyObject::Kind::Str: put_str(out, o.str_value()); break;
    case PyObject::Kind::List:
    case PyObject::Kind::Dict: {
      const bool dict = o.kind() == PyObject::Kind::Dict;
      const std::vector<PyObject>& items = o.items();
      out.push_back(dict ? '}' : ']');  // EMPTY_DICT / EMPTY_LIST
      for (size_t first = 0; first < items.size(); first += kBatch) {
        out.push_back('(');  // MARK
        for (size_t i = first; i < std::min(items.size(), first + kBatch); ++i) {
          if (dict) put_str(out, o.keys()[i]);
          put_object(items[i], out);
        }
        out.push_back(dict ? 'u' : 'e');  // SETITEMS / APPENDS
      }
      break;
    }
  }
}

}  // namespace

void write_pickle(const PyObject& o, std::string& out) {
  out.push_back(char(0x80));  // PROTO 4
  out.push_back(char(4));
  put_object(o, out);
  out.push_back('.');  // STOP
}

std::string pickle(const PyObject& o) {
  std::string out;
  write_pickle(o, out);
  return out;
}

}  // namespace llmhpc

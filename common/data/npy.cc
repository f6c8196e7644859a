// .npy parsing and writing, and a reader for the zip container of .npz files.
#include "common/data/npy.h"

#include <zlib.h>

#include <cstring>
#include <fstream>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/io/atomic_file.h"
#include "common/io/regular_file.h"

namespace localpar {
namespace {

absl::Status Bad(const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

size_t ItemSize(const std::string& dtype) {
  if (dtype.size() < 2) return 0;
  size_t n = 0;
  if (!absl::SimpleAtoi(dtype.substr(1), &n)) return 0;
  return n;
}

// The value of 'key' in the header's Python dict literal, as text.
bool DictValue(const std::string& header, const std::string& key, std::string* value) {
  for (const char* quote : {"'", "\""}) {
    const std::string k = absl::StrCat(quote, key, quote);
    size_t at = header.find(k);
    if (at == std::string::npos) continue;
    at = header.find(':', at + k.size());
    if (at == std::string::npos) return false;
    size_t begin = at + 1;
    while (begin < header.size() && header[begin] == ' ') ++begin;
    size_t end = begin;
    if (begin < header.size() && header[begin] == '(') {
      end = header.find(')', begin);
      if (end == std::string::npos) return false;
      ++end;
    } else if (begin < header.size() && (header[begin] == '\'' || header[begin] == '"')) {
      end = header.find(header[begin], begin + 1);
      if (end == std::string::npos) return false;
      ++end;
    } else {
      while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
    }
    *value = std::string(absl::StripAsciiWhitespace(header.substr(begin, end - begin)));
    return true;
  }
  return false;
}

uint32_t Le32(const unsigned char* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint16_t Le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

int64_t NpyArray::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double NpyArray::at(int64_t i) const {
  const char* p = data.data() + i * static_cast<int64_t>(ItemSize(dtype));
  auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return static_cast<double>(v);
  };
  if (dtype == "f4") return get(float{});
  if (dtype == "f8") return get(double{});
  if (dtype == "u1") return get(uint8_t{});
  if (dtype == "i1") return get(int8_t{});
  if (dtype == "u2") return get(uint16_t{});
  if (dtype == "i2") return get(int16_t{});
  if (dtype == "u4") return get(uint32_t{});
  if (dtype == "i4") return get(int32_t{});
  if (dtype == "u8") return get(uint64_t{});
  if (dtype == "i8") return get(int64_t{});
  return 0.0;
}

absl::StatusOr<NpyArray> ParseNpy(const std::string& bytes, const std::string& name) {
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) {
    return Bad(name, "not a .npy file (no \\x93NUMPY magic)");
  }
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const int major = u[6];
  size_t header_len = 0, at = 0;
  if (major == 1) {
    header_len = Le16(u + 8);
    at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Bad(name, "truncated header");
    header_len = Le32(u + 8);
    at = 12;
  } else {
    return Bad(name, absl::StrCat("header: unknown .npy format version ", major));
  }
  if (header_len > bytes.size() - at) return Bad(name, "header: runs past the end of the file");
  const std::string header = bytes.substr(at, header_len);
  std::string descr, fortran, shape;
  if (!DictValue(header, "descr", &descr) || !DictValue(header, "fortran_order", &fortran) ||
      !DictValue(header, "shape", &shape)) {
    return Bad(name, "header: needs 'descr', 'fortran_order' and 'shape'");
  }
  descr = std::string(absl::StripPrefix(absl::StripSuffix(descr, "'"), "'"));
  descr = std::string(absl::StripPrefix(absl::StripSuffix(descr, "\""), "\""));
  if (fortran != "False") return Bad(name, "header: Fortran-ordered arrays are not supported");
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')) {
    return Bad(name, absl::StrCat("header: dtype '", descr,
                                  "' is not supported (use little-endian numbers)"));
  }
  NpyArray a;
  a.dtype = descr.substr(1);
  static const char* kKnown[] = {"f4", "f8", "u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8"};
  bool known = false;
  for (const char* k : kKnown) known = known || a.dtype == k;
  if (!known) {
    return Bad(name, absl::StrCat("header: dtype '", descr,
                                  "' is not supported (float32/64 or integers)"));
  }
  std::string dims(absl::StripSuffix(absl::StripPrefix(shape, "("), ")"));
  for (absl::string_view d : absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(d), &v) || v < 0) {
      return Bad(name, absl::StrCat("header: bad shape ", shape));
    }
    if (v > 0 && a.count() > std::numeric_limits<int64_t>::max() / 16 / v) {
      return Bad(name, absl::StrCat("header: shape ", shape, " is too large"));
    }
    a.shape.push_back(v);
  }
  const size_t want = static_cast<size_t>(a.count()) * ItemSize(a.dtype);
  const size_t data_at = at + header_len;
  if (bytes.size() - data_at != want) {
    return Bad(name, absl::StrCat("holds ", bytes.size() - data_at, " bytes of data, its header ",
                                  shape, " of ", descr, " needs ", want));
  }
  a.data = bytes.substr(data_at);
  return a;
}

absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  return ParseNpy(*bytes, path);
}

absl::StatusOr<std::map<std::string, NpyArray>> ReadNpzFile(const std::string& path) {
  absl::StatusOr<std::string> file = ReadWholeFile(path);
  if (!file.ok()) return file.status();
  const std::string& z = *file;
  const auto* u = reinterpret_cast<const unsigned char*>(z.data());
  // The end-of-central-directory record: within the last 64 KiB + 22 bytes.
  if (z.size() < 22) return Bad(path, "not an .npz (zip) file");
  size_t eocd = std::string::npos;
  const size_t lowest = z.size() > 65557 ? z.size() - 65557 : 0;
  for (size_t i = z.size() - 22;; --i) {
    if (Le32(u + i) == 0x06054b50) {
      eocd = i;
      break;
    }
    if (i == lowest) break;
  }
  if (eocd == std::string::npos) return Bad(path, "not an .npz (zip) file");
  const uint16_t entries = Le16(u + eocd + 10);
  size_t cd = Le32(u + eocd + 16);
  std::map<std::string, NpyArray> out;
  for (uint16_t e = 0; e < entries; ++e) {
    if (cd + 46 > z.size() || Le32(u + cd) != 0x02014b50) {
      return Bad(path, "zip central directory is damaged");
    }
    const uint16_t method = Le16(u + cd + 10);
    uint64_t csize = Le32(u + cd + 20), usize = Le32(u + cd + 24);
    const uint16_t nlen = Le16(u + cd + 28), xlen = Le16(u + cd + 30), clen = Le16(u + cd + 32);
    uint64_t local = Le32(u + cd + 42);
    if (cd + 46 + nlen + xlen > z.size()) return Bad(path, "zip central directory is damaged");
    std::string name = z.substr(cd + 46, nlen);
    // Zip64 (NumPy writes it for every entry): the 0xffffffff fields are in extra block 1.
    for (size_t x = cd + 46 + nlen; x + 4 <= cd + 46 + nlen + xlen;) {
      const uint16_t id = Le16(u + x), len = Le16(u + x + 2);
      if (x + 4 + len > cd + 46 + nlen + xlen) break;
      if (id == 1) {
        size_t f = x + 4;
        auto take = [&](uint64_t* v) {
          if (*v != 0xffffffffu || f + 8 > x + 4 + len) return;
          uint64_t w = 0;
          std::memcpy(&w, u + f, 8);
          *v = w;
          f += 8;
        };
        take(&usize);
        take(&csize);
        take(&local);
      }
      x += 4 + len;
    }
    cd += 46 + nlen + xlen + clen;
    // Deflate expands at most ~1032:1, so a larger claim is damage, not data.
    if (usize > csize * 1032 + 1024 || csize > z.size() || local > z.size()) {
      return Bad(path, absl::StrCat(name, ": damaged zip entry sizes"));
    }
    if (local + 30 > z.size() || Le32(u + local) != 0x04034b50) {
      return Bad(path, absl::StrCat(name, ": damaged zip entry"));
    }
    const size_t data_at = local + 30 + Le16(u + local + 26) + Le16(u + local + 28);
    if (data_at + csize > z.size()) return Bad(path, absl::StrCat(name, ": truncated"));
    std::string bytes;
    if (method == 0) {
      bytes = z.substr(data_at, csize);
    } else if (method == 8) {
      bytes.resize(usize);
      z_stream s{};
      if (inflateInit2(&s, -MAX_WBITS) != Z_OK) return Bad(path, "zlib failed");
      s.next_in = const_cast<Bytef*>(u + data_at);
      s.avail_in = static_cast<uInt>(csize);
      s.next_out = reinterpret_cast<Bytef*>(bytes.data());
      s.avail_out = static_cast<uInt>(usize);
      int rc = inflate(&s, Z_FINISH);
      inflateEnd(&s);
      if (rc != Z_STREAM_END || s.total_out != usize) {
        return Bad(path, absl::StrCat(name, ": cannot inflate"));
      }
    } else {
      return Bad(path,
                 absl::StrCat(name, ": zip compression method ", method, " is not supported"));
    }
    std::string key(absl::StripSuffix(name, ".npy"));
    absl::StatusOr<NpyArray> a = ParseNpy(bytes, absl::StrCat(path, ":", name));
    if (!a.ok()) return a.status();
    out[key] = *std::move(a);
  }
  return out;
}

absl::Status WriteNpyFile(const std::string& path, const std::vector<int64_t>& shape,
                          const std::vector<float>& values) {
  std::string dims;
  for (int64_t d : shape) absl::StrAppend(&dims, d, ",");
  if (shape.size() > 1) dims.pop_back();
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string file("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  file.push_back(static_cast<char>(len & 0xff));
  file.push_back(static_cast<char>(len >> 8));
  file += header;
  file.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  return WriteFileAtomically(path, file);
}

}  // namespace localpar

#pragma once
// Argument checks that throw std::invalid_argument naming the function, the argument, what was given
// and what was expected.

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace paraseq::detail {

template <class View>
std::string shape_of(const View& view) {
  std::string text = "[";
  for (std::size_t r = 0; r < View::rank; ++r) text += (r ? ", " : "") + std::to_string(view.extent(r));
  return text + "]";
}

inline std::string shape_text(std::initializer_list<long> extents) {
  std::string text = "[";
  bool first = true;
  for (long e : extents) {
    text += (first ? "" : ", ") + std::to_string(e);
    first = false;
  }
  return text + "]";
}

[[noreturn]] inline void throw_invalid(const std::string& fn, const std::string& argument, const std::string& given,
                                       const std::string& expected) {
  throw std::invalid_argument(fn + ": argument '" + argument + "' has " + given + ", expected " + expected);
}

// Requires view's extents to equal `extents` (same rank); `meaning` says where the numbers come from.
template <class View>
void require_extents(const std::string& fn, const std::string& argument, const View& view,
                     std::initializer_list<long> extents, const std::string& meaning) {
  bool equal = extents.size() == View::rank;
  std::size_t r = 0;
  for (long e : extents) equal = equal && r < View::rank && long(view.extent(r++)) == e;
  if (!equal) throw_invalid(fn, argument, "shape " + shape_of(view), "shape " + shape_text(extents) + " (" + meaning + ")");
}

} // namespace paraseq::detail

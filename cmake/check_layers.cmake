# The layering check (docs/design.md "Layers"): every project include of a layer's files
# must name a header the layer may use. Run at build time for each layer library, before its
# sources compile, so an include against the design fails the build with a message that
# says which file, which include, and what the layer may include instead.
#
#   cmake -DRULES=<file> -DROOT=<source dir> [-DSTAMP=<file>] -P check_layers.cmake
#
# RULES is written by CMakeLists.txt (llmhpc_layer): `set(LAYER name)`, `set(FILES ...)` (the
# layer's sources and headers, absolute) and `set(MAY_INCLUDE ...)`: patterns relative to the
# source root, a trailing "/" for a whole directory ("src/core/"), "*" for any name within one
# directory ("comm/*.h"), anything else one file ("kernels/ops.h"). Quoted includes that are
# not files of the source tree (generated or system headers) are not checked.
cmake_minimum_required(VERSION 3.22)
include(${RULES})

set(patterns "")
foreach(p IN LISTS MAY_INCLUDE)
  string(REGEX REPLACE "([.+])" "\\\\\\1" rx "${p}")
  string(REPLACE "*" "[^/]*" rx "${rx}")
  if(p MATCHES "/$")
    list(APPEND patterns "^${rx}")
  else()
    list(APPEND patterns "^${rx}$")
  endif()
endforeach()

set(errors "")
foreach(file IN LISTS FILES)
  if(NOT file)
    continue()
  endif()
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  file(RELATIVE_PATH where "${ROOT}" "${file}")
  foreach(line IN LISTS lines)
    string(REGEX MATCH "\"([^\"]+)\"" _ "${line}")
    set(header "${CMAKE_MATCH_1}")
    if(NOT EXISTS "${ROOT}/${header}")
      continue()  # generated (git_sha.h) or not ours
    endif()
    set(allowed FALSE)
    foreach(rx IN LISTS patterns)
      if(header MATCHES "${rx}")
        set(allowed TRUE)
        break()
      endif()
    endforeach()
    if(NOT allowed)
      string(APPEND errors "  ${where} includes \"${header}\"\n")
    endif()
  endforeach()
endforeach()

if(errors)
  string(REPLACE ";" " " may "${MAY_INCLUDE}")
  message(FATAL_ERROR "layering: layer '${LAYER}' includes outside what it may use:\n${errors}"
                      "  layer '${LAYER}' may include: ${may}\n"
                      "  (the allowed directions are in docs/design.md and CMakeLists.txt, llmhpc_layer)")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()

# cmake/install.cmake - `make install`: the static and shared libraries, the
# public headers (with the generated version.h), the kvcache command, a
# pkg-config file and a CMake package (find_package(kvcache)), all
# relocatable.  Included from CMakeLists.txt once the targets exist.
#
#   kvcache::kvcache          the shared library (libkvcache.so.0)
#   kvcache::kvcache_static   the static library (libkvcache.a)
#
# The libraries' dependencies are read from the static library's link line,
# so a dependency added there (target_link_libraries(kvcache PUBLIC
# PkgConfig::FOO) after pkg_check_modules(FOO ... IMPORTED_TARGET foo))
# reaches kvcache.pc and kvcacheConfig.cmake with no change here.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(KVC_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvcache)
set(KVC_INSTALL_PCDIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# ---- what users of the targets see -------------------------------------------
# The headers: the source tree's and the generated version.h while building, <prefix>/include
# once installed.  (This replaces the source path set with the targets above: an installed
# package must not point into the source tree.)
foreach(t kvcache kvcache_shared)
  set_property(TARGET ${t} PROPERTY INTERFACE_INCLUDE_DIRECTORIES
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${KVC_GENERATED_INCLUDE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
endforeach()
# The shared library records its own dependencies (DT_NEEDED) and no public header includes
# theirs, so a program that links it needs none of them: keep them off its link interface.  The
# static library passes them on, since an archive cannot.
set_property(TARGET kvcache_shared PROPERTY INTERFACE_LINK_LIBRARIES "")
set_target_properties(kvcache_shared PROPERTIES EXPORT_NAME kvcache)
set_target_properties(kvcache PROPERTIES EXPORT_NAME kvcache_static)
# The same names inside this build tree (add_subdirectory users).
add_library(kvcache::kvcache ALIAS kvcache_shared)
add_library(kvcache::kvcache_static ALIAS kvcache)

# ---- the dependencies, for kvcache.pc and kvcacheConfig.cmake ------------------------------
set(KVC_PC_REQUIRES_PRIVATE "")
set(KVC_PC_LIBS_PRIVATE "")
set(KVC_CONFIG_PKG_DEPS "")
get_target_property(kvc_static_deps kvcache INTERFACE_LINK_LIBRARIES)
foreach(dep IN LISTS kvc_static_deps)
  if(dep MATCHES "^PkgConfig::(.+)$")
    set(kvc_prefix ${CMAKE_MATCH_1})
    set(kvc_module "${${kvc_prefix}_MODULE_NAME}")
    if(NOT kvc_module)
      message(FATAL_ERROR "install.cmake: ${dep} does not come from pkg_check_modules(${kvc_prefix} ...)")
    endif()
    list(APPEND KVC_PC_REQUIRES_PRIVATE ${kvc_module})
    string(APPEND KVC_CONFIG_PKG_DEPS
      "pkg_check_modules(${kvc_prefix} QUIET IMPORTED_TARGET ${kvc_module})\n"
      "if(NOT ${kvc_prefix}_FOUND)\n"
      "  set(kvcache_FOUND FALSE)\n"
      "  set(kvcache_NOT_FOUND_MESSAGE \"kvcache needs ${kvc_module} (pkg-config could not find it)\")\n"
      "  return()\n"
      "endif()\n")
  elseif(dep STREQUAL "Threads::Threads")
    if(CMAKE_THREAD_LIBS_INIT)
      list(APPEND KVC_PC_LIBS_PRIVATE ${CMAKE_THREAD_LIBS_INIT})
    endif()
  elseif(dep MATCHES "^[A-Za-z0-9_+-]+$")
    list(APPEND KVC_PC_LIBS_PRIVATE -l${dep})
  else()
    message(FATAL_ERROR "install.cmake: cannot describe the dependency '${dep}' in kvcache.pc")
  endif()
endforeach()
list(JOIN KVC_PC_REQUIRES_PRIVATE " " KVC_PC_REQUIRES_PRIVATE)
list(JOIN KVC_PC_LIBS_PRIVATE " " KVC_PC_LIBS_PRIVATE)

# ---- kvcache.pc ------------------------------------------------------------------------
# prefix is ${pcfiledir} and the way back up from the pkgconfig folder, so that the file
# stays right wherever the tree is installed or moved (as the CMake package does).
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "install.cmake: CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR must be relative")
endif()
string(REGEX REPLACE "[^/]+" ".." KVC_PC_PREFIX_FROM_PCDIR "${KVC_INSTALL_PCDIR}")
set(KVC_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
set(KVC_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvcache.pc.in ${PROJECT_BINARY_DIR}/kvcache.pc @ONLY)

# ---- the CMake package -------------------------------------------------------------------
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvcacheConfig.cmake.in
  ${PROJECT_BINARY_DIR}/kvcacheConfig.cmake INSTALL_DESTINATION ${KVC_INSTALL_CMAKEDIR})
# 0.x: a new minor version may break the API, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)

# ---- install rules ---------------------------------------------------------------------
# Two components, as a distribution splits them: Runtime (the shared library, the command)
# and Development (headers, the static library, kvcache.pc, the CMake package).
install(TARGETS kvcache_shared EXPORT kvcacheTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Runtime NAMELINK_COMPONENT Development)
install(TARGETS kvcache EXPORT kvcacheTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT Development)
install(TARGETS kvcache_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT Runtime)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kvcache ${KVC_GENERATED_INCLUDE_DIR}/kvcache
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT Development FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/kvcache.pc DESTINATION ${KVC_INSTALL_PCDIR}
  COMPONENT Development)
install(EXPORT kvcacheTargets NAMESPACE kvcache:: DESTINATION ${KVC_INSTALL_CMAKEDIR}
  COMPONENT Development)
install(FILES ${PROJECT_BINARY_DIR}/kvcacheConfig.cmake
  ${PROJECT_BINARY_DIR}/kvcacheConfigVersion.cmake
  DESTINATION ${KVC_INSTALL_CMAKEDIR} COMPONENT Development)

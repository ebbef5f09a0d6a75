;;; magent-store-json.el --- JSON text for the magent-store backend  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; The package's one JSON encoder.  Its sentinels are magent's and
;; json.el's: `:null' is null and `:json-false' is false, in what Emacs
;; sends and in what it reads back (`magent-store-json-false'), so that a
;; value magent made crosses the adapter unchanged and a snapshot read
;; back encodes as it was written.  Text is multibyte on every Emacs:
;; since Emacs 30 `json-serialize' returns unibyte UTF-8, which `prin1'
;; would write as octal escapes the backend cannot read.
;;
;; Every difference between the Emacs versions the package supports in
;; how JSON is written is named here, found by trying the feature rather
;; than by reading version numbers.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

(require 'json)
(require 'subr-x)

(defconst magent-store-json-false :json-false
  "What false is in Lisp values the package writes or reads as JSON.
magent's marker (and json.el's); null is `:null' when written and nil
when read.")

(defconst magent-store-json--probe
  (condition-case nil
      (json-serialize ["\u00e9"])
    (error nil))
  "What `json-serialize' makes of a non-ASCII string; nil without it.")

(defconst magent-store-json--native (stringp magent-store-json--probe)
  "Non-nil when this Emacs has native JSON (`json-serialize').
Without it, JSON is written by `json-encode'.")

(defconst magent-store-json--unibyte
  (and magent-store-json--native
       (not (multibyte-string-p magent-store-json--probe)))
  "Non-nil when `json-serialize' returns unibyte UTF-8 (Emacs 30 on).
`prin1' writes the bytes of such a string as octal escapes, which the
backend cannot read, so the text is decoded before it is sent.")

(defun magent-store-json-text (string)
  "Return STRING as text: unchanged when multibyte, else decoded as UTF-8.
A unibyte string holds bytes (what `json-serialize' returns since
Emacs 30, or an encoded file name); an ASCII one is returned as is."
  (if (multibyte-string-p string)
      string
    (decode-coding-string string 'utf-8-unix t)))

(defun magent-store-json-encode (object)
  "Return OBJECT as JSON text, multibyte on every Emacs.
Strings in OBJECT that hold UTF-8 bytes are text too: native JSON
refuses them on Emacs 30 and takes them as UTF-8 on Emacs 28, so
they are decoded first when it refuses.  What it still refuses (a
symbol as a value, say) is written by `json-encode'."
  (magent-store-json-text
   (or (magent-store-json--try-native object)
       (let ((object (magent-store-json--textify object)))
         (or (magent-store-json--try-native object)
             (let ((json-null :null)
                   (json-false magent-store-json-false)
                   (json-encoding-pretty-print nil))
               (json-encode object)))))))

(defun magent-store-json-serialize (object)
  "Return OBJECT as JSON text by `json-serialize', multibyte on every Emacs.
Signal what `json-serialize' signals when OBJECT is not JSON: unlike
`magent-store-json-encode', which then finds a form that is, the
caller decides what to make of it."
  (magent-store-json-text (json-serialize object :null-object :null
                                      :false-object magent-store-json-false)))

(defun magent-store-json--try-native (object)
  "Return OBJECT as JSON text by `json-serialize', or nil if it cannot."
  (when-let ((json (and magent-store-json--native
                        (condition-case nil
                            (json-serialize
                             object :null-object :null
                             :false-object magent-store-json-false)
                          ((wrong-type-argument json-error) nil)))))
    (if magent-store-json--unibyte
        (decode-coding-string json 'utf-8-unix t)
      json)))

(defun magent-store-json--textify (object)
  "Return a copy of OBJECT whose strings are text (see `magent-store-json-text')."
  (cond ((stringp object) (magent-store-json-text object))
        ((consp object)
         ;; A loop, not recursion, along a list: lists may be long.
         (let (items)
           (while (consp object)
             (push (magent-store-json--textify (pop object)) items))
           (nconc (nreverse items) (magent-store-json--textify object))))
        ((vectorp object) (vconcat (mapcar #'magent-store-json--textify object)))
        ((hash-table-p object)
         (let ((copy (copy-hash-table object)))
           (maphash (lambda (key value)
                      (puthash key (magent-store-json--textify value) copy))
                    object)
           copy))
        (t object)))

(defun magent-store-json-arg (value)
  "Return VALUE, an alist or its JSON text, as JSON text for the wire.
JSON text may come from `json-serialize' (unibyte since Emacs 30) or
`json-encode' (multibyte)."
  (if (stringp value) (magent-store-json-text value) (magent-store-json-encode value)))

(defun magent-store-scope-json (scope)
  "Return SCOPE (`global', a project root, or (action . NAME)) as JSON text."
  (magent-store-json-encode
   (pcase scope
     ((or 'nil 'global "global") "global")
     ((pred stringp) (expand-file-name (magent-store-json-text scope)))
     (`(action . ,name) `((action . ,(format "%s" name))))
     (_ (user-error "Invalid magent-store scope: %S" scope)))))

(provide 'magent-store-json)
;;; magent-store-json.el ends here
